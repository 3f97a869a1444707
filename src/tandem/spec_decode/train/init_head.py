"""A fresh draft head's tensors, from the target's last decoder layer (``train-drafter`` step 2).

EAGLE / MTP start as a pass-through of their (normed) feature: zero output projections, an fc that copies
the feature; EAGLE-3's attention starts as the last layer's projection on the hidden half of its input.

The head is a Llama-style layer (the public EAGLE layouts') whatever the target's family, so a Gemma 3
target's layer is translated: its zero-centred norm weights become gains (``norm_offset + w``), and its
pre-MLP norm is ``pre_feedforward_layernorm`` (Gemma's ``post_attention_layernorm`` is the sandwich norm
on the attention output, which the head has no place for). Its q/k norms and GELU have no counterpart
either: the copied matrices are a starting point, not the target's layer.
"""

from __future__ import annotations

import math

import torch

from tandem.model.model_args import ModelArgs
from tandem.spec_decode.eagle_checkpoint import HeadConfig


def init_tensors(cfg: HeadConfig, t: dict[str, torch.Tensor], args: ModelArgs, seed: int) -> dict[str, torch.Tensor]:
    """Canonical head tensors from the target's last decoder layer; fc passes the feature through."""
    gen = torch.Generator().manual_seed(seed)
    h = cfg.hidden_size
    last = f"model.layers.{args.num_hidden_layers - 1}."

    def get(name: str) -> torch.Tensor:
        return t[last + name].float().clone()

    def gain(name: str) -> torch.Tensor:  # a norm weight as the gain the head multiplies by
        return t[name].float() + args.norm_offset

    in_norm = gain(last + "input_layernorm.weight")
    mlp_norm = "pre_feedforward_layernorm.weight" if args.sandwich_norms else "post_attention_layernorm.weight"
    out: dict[str, torch.Tensor] = {
        "post_attention_layernorm.weight": gain(last + mlp_norm),
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
        out["norm.weight"] = gain("model.norm.weight")
    else:
        # Attention reads [embedding, hidden]: the hidden half starts as the last layer's projection.
        for n in "qkv":
            w = qkv[n]
            out[f"self_attn.{n}_proj.weight"] = torch.cat([small(w.shape[0], h), w], dim=1)
        out["input_layernorm.weight"] = in_norm.clone()
        out["hidden_norm.weight"] = in_norm.clone()
        n_aux = len(cfg.aux_layer_ids)
        out["fc.weight"] = torch.cat([small(h, h) for _ in range(n_aux - 1)] + [eye], dim=1)
        out["norm.weight"] = gain("model.norm.weight")
    return out
