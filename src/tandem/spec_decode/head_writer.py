"""Writing draft heads in the layouts ``eagle_checkpoint.py`` reads: EAGLE / EAGLE-3 heads as
``config.json`` + safetensors, and an MTP layer's tensors under their DeepSeek-V3 names for a target
checkpoint. The inverse of the readers; used by ``tandem train-drafter`` and by tests that build tiny heads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tandem.model.model_args import ModelArgs
from tandem.spec_decode.eagle_checkpoint import HeadConfig, mtp_layer_prefix, validate


def _config_json(cfg: HeadConfig, dtype: torch.dtype) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if cfg.method == "eagle3":
        base["architectures"] = ["LlamaForCausalLMEagle3"]
        base["target_hidden_size"] = cfg.target_hidden_size or cfg.hidden_size
        base["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids)}
    else:
        base["architectures"] = ["LlamaForCausalLM"]
    return base


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (t.to(dtype) if t.is_floating_point() else t).contiguous().clone()


def save_eagle_head(
    directory: str | Path,
    cfg: HeadConfig,
    tensors: Mapping[str, torch.Tensor],
    dtype: torch.dtype = torch.float16,
    extra_config: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``tensors`` (canonical names) as an EAGLE / EAGLE-3 head in the public layout."""
    if cfg.method not in ("eagle", "eagle3"):
        raise ValueError(f"save_eagle_head writes eagle / eagle3 heads, not {cfg.method}")
    validate(cfg, tensors, "head to save")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    layer = "midlayer." if cfg.method == "eagle3" else "layers.0."
    top = {"fc.weight", "fc.bias", "norm.weight", "embed_tokens.weight", "lm_head.weight", "d2t", "t2d"}
    named = {(n if n in top else layer + n): _cast(t, dtype) for n, t in tensors.items()}
    save_file(named, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = _config_json(cfg, dtype) | dict(extra_config or {})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def mtp_file_tensors(
    cfg: HeadConfig, tensors: Mapping[str, torch.Tensor], args: ModelArgs, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Canonical MTP tensors under their DeepSeek-V3 names in a target checkpoint."""
    validate(cfg, tensors, "MTP layer to save")
    prefix = mtp_layer_prefix(args)
    rename = {"fc.weight": "eh_proj.weight", "norm.weight": "shared_head.norm.weight"}
    return {prefix + rename.get(n, n): _cast(t, dtype) for n, t in tensors.items()}


def mtp_config_keys(cfg: HeadConfig) -> dict[str, Any]:
    """What a target ``config.json`` gains with an MTP layer."""
    keys: dict[str, Any] = {"num_nextn_predict_layers": 1}
    if cfg.draft_vocab_size != cfg.vocab_size:
        keys["mtp_draft_vocab_size"] = cfg.draft_vocab_size
    return keys
