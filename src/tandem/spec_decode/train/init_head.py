"""A fresh draft head's tensors, from the target's last decoder layer (``train-drafter`` step 2).

EAGLE / MTP start as a pass-through of their (normed) feature: zero output projections, an fc that copies
the feature; EAGLE-3's attention starts as the last layer's projection on the hidden half of its input.
"""

from __future__ import annotations

import math

import torch

from tandem.spec_decode.eagle_checkpoint import HeadConfig


def init_tensors(cfg: HeadConfig, t: dict[str, torch.Tensor], num_layers: int, seed: int) -> dict[str, torch.Tensor]:
    """Canonical head tensors from the target's last decoder layer; fc passes the feature through."""
    gen = torch.Generator().manual_seed(seed)
    h = cfg.hidden_size
    last = f"model.layers.{num_layers - 1}."

    def get(name: str) -> torch.Tensor:
        return t[last + name].float().clone()

    in_norm = get("input_layernorm.weight")
    out: dict[str, torch.Tensor] = {
        "post_attention_layernorm.weight": get("post_attention_layernorm.weight"),
        "self_attn.o_proj.weight": get("self_attn.o_proj.weight"),
        "mlp.gate_proj.weight": get("mlp.gate_proj.weight"),
        "mlp.up_proj.weight": get("mlp.up_proj.weight"),
        "mlp.down_proj.weight": get("mlp.down_proj.weight"),
    }
    qkv = {n: get(f"self_attn.{n}_proj.weight") for n in "qkv"}
    eye = torch.eye(h)

    def small(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * (0.02 / math.sqrt(shape[-1] / h))

    if cfg.method in ("eagle", "mtp"):
        # The head starts as a pass-through of its (normed) feature: the last layer's output
        # projections expect the target's much larger residual stream, and EAGLE has no norm before
        # its LM head nor between chained steps, so full-size updates blow the chain up. Zero output
        # projections still get gradients (and pass them on once they move).
        out["self_attn.o_proj.weight"] = torch.zeros_like(out["self_attn.o_proj.weight"])
        out["mlp.down_proj.weight"] = torch.zeros_like(out["mlp.down_proj.weight"])
    if cfg.method == "eagle":
        # No input norm in the public EAGLE layout: fold the last layer's input gain into q/k/v.
        for n in "qkv":
            out[f"self_attn.{n}_proj.weight"] = qkv[n] * in_norm
        out["fc.weight"] = torch.cat([small(h, h), eye], dim=1)
        out["fc.bias"] = torch.zeros(h)
    elif cfg.method == "mtp":
        for n in "qkv":
            out[f"self_attn.{n}_proj.weight"] = qkv[n]
        out["input_layernorm.weight"] = in_norm
        out["fc.weight"] = torch.cat([small(h, h), eye], dim=1)
        out["enorm.weight"] = torch.ones(h)
        out["hnorm.weight"] = torch.ones(h)
        out["norm.weight"] = t["model.norm.weight"].float().clone()
    else:
        # Attention reads [embedding, hidden]: the hidden half starts as the last layer's projection.
        for n in "qkv":
            w = qkv[n]
            out[f"self_attn.{n}_proj.weight"] = torch.cat([small(w.shape[0], h), w], dim=1)
        out["input_layernorm.weight"] = in_norm.clone()
        out["hidden_norm.weight"] = in_norm.clone()
        n_aux = len(cfg.aux_layer_ids)
        out["fc.weight"] = torch.cat([small(h, h) for _ in range(n_aux - 1)] + [eye], dim=1)
        out["norm.weight"] = t["model.norm.weight"].float().clone()
    return out
