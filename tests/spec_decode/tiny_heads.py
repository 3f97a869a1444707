"""Tiny random checkpoints for the drafter tests: targets (transformers' Llama and Gemma 3), and heads written
in the public layouts by hand (tensor names spelled out here, independent of tandem's writer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tests.model.test_loader_hf import VOCAB, save_tiny, write_tiny_tokenizer

H, I, HEADS, KV, HD = 32, 48, 4, 2, 8


def tiny_target(tmp_path: Path, **overrides: Any) -> Path:
    directory, _ = save_tiny(tmp_path, "llama", num_hidden_layers=4, **overrides)
    return directory


def tiny_gemma_target(tmp_path: Path, max_position_embeddings: int = 256, **tokenizer: Any) -> Path:
    """A 4-layer Gemma 3 (sandwich norms, zero-centred gains drawn at random so a missing or doubled
    ``1 + w`` shows, GELU, q/k norms, a query_pre_attn_scalar that is not head_dim, window-8 sliding layers
    with their own RoPE base beside global ones) with the tiny byte-level tokenizer."""
    import transformers

    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=H, intermediate_size=I, num_hidden_layers=4, num_attention_heads=HEADS,
        num_key_value_heads=KV, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
        max_position_embeddings=max_position_embeddings, bos_token_id=258, eos_token_id=259, pad_token_id=260,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    )
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    directory = tmp_path / "gemma3"
    model.save_pretrained(directory)
    write_tiny_tokenizer(directory, **tokenizer)
    return directory


def _layer(gen: torch.Generator, attn_in: int, prefix: str, input_norm: bool = True) -> dict[str, torch.Tensor]:
    def r(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    out = {
        prefix + "self_attn.q_proj.weight": r(HEADS * HD, attn_in),
        prefix + "self_attn.k_proj.weight": r(KV * HD, attn_in),
        prefix + "self_attn.v_proj.weight": r(KV * HD, attn_in),
        prefix + "self_attn.o_proj.weight": r(H, HEADS * HD),
        prefix + "post_attention_layernorm.weight": 1 + r(H),
        prefix + "mlp.gate_proj.weight": r(I, H),
        prefix + "mlp.up_proj.weight": r(I, H),
        prefix + "mlp.down_proj.weight": r(H, I),
    }
    if input_norm:
        out[prefix + "input_layernorm.weight"] = 1 + r(H)
    return out


def _config(vocab: int, **extra: Any) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": I, "num_hidden_layers": 1, "num_attention_heads": HEADS,
        "num_key_value_heads": KV, "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
        "max_position_embeddings": 256,
    } | extra


def write_eagle(directory: Path, vocab: int, *, seed: int = 1, embed: torch.Tensor | None = None,
                lm_head: torch.Tensor | None = None, prefix: str = "", **config: Any) -> Path:
    """EAGLE-1 layout: fc (with bias), layers.0.* without input_layernorm, optional embedding / head."""
    gen = torch.Generator().manual_seed(seed)
    t = {prefix + "fc.weight": torch.randn(H, 2 * H, generator=gen) * 0.2,
         prefix + "fc.bias": torch.randn(H, generator=gen) * 0.1}
    t |= _layer(gen, H, prefix + "layers.0.", input_norm=False)
    if embed is not None:
        t[prefix + "embed_tokens.weight"] = embed
    if lm_head is not None:
        t[prefix + "lm_head.weight"] = lm_head
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(_config(vocab, **config)))
    return directory


def write_eagle3(directory: Path, vocab: int, draft_vocab: int, *, seed: int = 2,
                 layer_ids: list[int] | None = None, d2t: torch.Tensor | None = None,
                 own_head: bool = True, embed: torch.Tensor | None = None) -> Path:
    """EAGLE-3 layout: fc [H, 3H], midlayer.* (q/k/v over 2H, hidden_norm), norm, lm_head [Vd, H], d2t/t2d."""
    gen = torch.Generator().manual_seed(seed)
    t = {"fc.weight": torch.randn(H, 3 * H, generator=gen) * 0.2,
         "midlayer.hidden_norm.weight": 1 + 0.2 * torch.randn(H, generator=gen),
         "norm.weight": 1 + 0.2 * torch.randn(H, generator=gen)}
    t |= _layer(gen, 2 * H, "midlayer.")
    if own_head:
        t["lm_head.weight"] = torch.randn(draft_vocab, H, generator=gen) * 0.3
    if d2t is not None:
        t["d2t"] = d2t
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[torch.arange(draft_vocab) + d2t] = True
        t["t2d"] = t2d
    if embed is not None:
        t["embed_tokens.weight"] = embed
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.items()}, str(directory / "model.safetensors"))
    extra: dict[str, Any] = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab}
    if layer_ids is not None:
        extra["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layer_ids}
    (directory / "config.json").write_text(json.dumps(_config(vocab, **extra)))
    return directory


def add_mtp(target_dir: Path, *, seed: int = 3, copies: bool = True) -> Path:
    """Add a DeepSeek-V3-style MTP layer (index = num_hidden_layers) to a target checkpoint in place."""
    config = json.loads((target_dir / "config.json").read_text())
    n = config["num_hidden_layers"]
    p = f"model.layers.{n}."
    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(str(target_dir / "model.safetensors"))
    mtp = {p + "eh_proj.weight": torch.randn(H, 2 * H, generator=gen) * 0.2,
           p + "enorm.weight": 1 + 0.2 * torch.randn(H, generator=gen),
           p + "hnorm.weight": 1 + 0.2 * torch.randn(H, generator=gen),
           p + "shared_head.norm.weight": 1 + 0.2 * torch.randn(H, generator=gen)}
    mtp |= _layer(gen, H, p)
    if copies:  # DeepSeek-V3 stores copies of the embedding and head in the MTP layer
        mtp[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
        mtp[p + "shared_head.head.weight"] = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"]).clone() + 1.0
    save_file({k: v.contiguous() for k, v in (tensors | mtp).items()}, str(target_dir / "model.safetensors"))
    config["num_nextn_predict_layers"] = 1
    (target_dir / "config.json").write_text(json.dumps(config))
    return target_dir
