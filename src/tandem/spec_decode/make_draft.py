"""``tandem make-draft``: export the first N layers of a model, with its final norm and LM head, as a
stand-alone Hugging Face checkpoint — a small draft model with the target's exact tokenizer.

The shipped drafts are built this way, locally and deterministically, from the known targets' GGUF files
(nothing is downloaded): ``<target>-draft`` (:data:`SHIPPED_DRAFTS`) resolves to
``$TANDEM_CACHE_DIR/drafts/<target>-L{N}`` and is exported on first use. ``draft_model`` without a
``speculative_config.model`` takes the draft of its target (:func:`shipped_draft_for_target`).

The ``config.json`` is the one transformers writes for the family, so that both tandem
(``ModelArgs.from_hf_config``) and ``transformers.AutoModelForCausalLM`` read the export back as the same
model. Gemma 3 keeps its own fields: ``layer_types`` of the kept layers, ``sliding_window``,
``rope_parameters`` per attention type, ``query_pre_attn_scalar``, ``hidden_activation``; its norm
weights stay zero-centred (the gain is ``1 + w``), which is both tandem's and transformers' convention
for Hugging Face tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tandem.cache import cache_dir  # noqa: F401  (re-exported: callers import it from here)
from tandem.model.loader import Checkpoint, load_checkpoint
from tandem.model.model_args import ModelArgs

DEFAULT_DRAFT_LAYERS = 6
# Shipped draft name -> (target, layers). Gemma 3 270M: its first 6 of 18 layers, one whole group of its
# 5-sliding + 1-global layer pattern, so the draft keeps a global layer. It drafts exactly but rarely right:
# how often the first N layers' greedy token is the target's (10 code prompts, 640 response tokens) is
# 0.015 for N = 6, 0.19 for 12, 0.55 for 15, 0.85 for 17 (first 6 + last 2 layers: 0.075), and its 262k-row
# LM head makes a draft token cost ~3/4 of a target token, so no N speeds Gemma 3 270M up; 6 is the
# cheapest whole group. A trained head (eagle3, reduced draft vocabulary) is the drafter for it.
SHIPPED_DRAFTS: dict[str, tuple[str, int]] = {
    "smollm2-135m-instruct-draft": ("smollm2-135m-instruct", DEFAULT_DRAFT_LAYERS),
    "gemma-3-270m-draft": ("gemma-3-270m", 6),
}
_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
}


def hf_config(args: ModelArgs, num_layers: int, dtype: torch.dtype) -> dict[str, Any]:
    """The ``config.json`` of the first ``num_layers`` layers of a model with ``args``."""
    model_type, arch = _ARCHITECTURES[args.family]
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_key_value_heads,
        "head_dim": args.head_dim,
        "rms_norm_eps": args.rms_norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": args.rope_scaling,
        "max_position_embeddings": args.max_position_embeddings,
        "tie_word_embeddings": args.tie_word_embeddings,
        "attention_bias": args.attention_bias,
        "bos_token_id": args.bos_token_id,
        "eos_token_id": list(args.eos_token_ids),
        "dtype": str(dtype).removeprefix("torch."),
    }
    if args.family == "gemma3":
        config |= _gemma3_config(args, num_layers)
        del config["rope_theta"], config["rope_scaling"]  # per attention type, in rope_parameters
    return config


def _gemma3_config(args: ModelArgs, num_layers: int) -> dict[str, Any]:
    """Gemma 3's own keys, as transformers >= 5 writes them (``_gemma3_fields`` reads them back)."""
    windows = args.layer_windows[:num_layers] or (0,) * num_layers
    sizes = set(args.layer_windows) - {0}
    if len(sizes) > 1:
        raise ValueError(f"a Gemma 3 config has one sliding_window; this model has {sorted(sizes)}")
    full = {"rope_type": "default", **(args.rope_scaling or {}), "rope_theta": args.rope_theta}
    local_theta = args.rope_local_theta if args.rope_local_theta is not None else args.rope_theta
    scalar = args.query_pre_attn_scalar or args.head_dim
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": int(scalar) if float(scalar).is_integer() else scalar,  # transformers: an int
        "sliding_window": sizes.pop() if sizes else None,
        "layer_types": ["sliding_attention" if w else "full_attention" for w in windows],
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": local_theta},
        },
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }


def make_draft(target: str, out_dir: str | Path, num_layers: int, dtype: torch.dtype = torch.float32) -> Path:
    if num_layers < 1:
        raise ValueError(f"num_layers must be at least 1, got {num_layers}")
    ckpt = load_checkpoint(target, dtype, num_layers=num_layers)  # the kept layers' tensors only
    args = ckpt.args
    if num_layers > args.num_hidden_layers:
        raise ValueError(f"num_layers must be in [1, {args.num_hidden_layers}], got {num_layers}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keep = {}
    for name, t in ckpt.tensors.items():
        if name.startswith("model.layers."):
            if int(name.split(".")[2]) >= num_layers:
                continue
        keep[name] = t.contiguous().clone()
    save_file(keep, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = hf_config(args, num_layers, dtype)
    tok = ckpt.tokenizer
    config["pad_token_id"] = tok.pad_token_id
    config["tandem_draft_of"] = str(ckpt.source.name)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(ckpt, out)
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": sorted(tok.eos_token_ids | set(args.eos_token_ids))})
    )
    return out


def save_tokenizer(ckpt: Checkpoint, out: Path) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json``: what ``tokenizer_hf.hf_tokenizer`` reads back as the
    same tokenizer (vocabulary, special tokens, BOS / EOS insertion, chat template)."""
    tok = ckpt.tokenizer
    tok.backend.save(str(out / "tokenizer.json"))

    def text(token_id: int | None) -> str | None:
        return None if token_id is None else tok.backend.id_to_token(token_id)

    tok_config: dict[str, Any] = {
        "bos_token": text(tok.bos_token_id),
        "eos_token": text(tok.eos_token_id),
        "pad_token": text(tok.pad_token_id),
        "unk_token": text(tok.specials.unk_token_id),
    }
    if not tok.specials.backend_post_processor:  # else tokenizer.json's post-processor adds them, as here
        tok_config |= {"add_bos_token": tok.specials.add_bos, "add_eos_token": tok.specials.add_eos}
    if tok.chat_template is not None:
        tok_config["chat_template"] = tok.chat_template.source
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))


def resolve_shipped_draft(name: str) -> Path | None:
    """Path of a shipped draft, exporting it on first use; None if ``name`` is not one."""
    entry = SHIPPED_DRAFTS.get(name.lower())
    if entry is None:
        return None
    target, layers = entry
    out = cache_dir() / "drafts" / f"{target}-L{layers}"
    if not (out / "model.safetensors").is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        make_draft(target, tmp, layers)
        tmp.replace(out) if not out.exists() else None
    return out


def shipped_draft_for_target(checkpoint: Checkpoint | Path | None) -> str | None:
    """The name of the draft shipped for ``checkpoint``'s model (a known target; or the model file), or None."""
    from tandem.spec_decode.shipped import known_target_name

    name = known_target_name(checkpoint, {t for t, _ in SHIPPED_DRAFTS.values()})
    return next((d for d, (t, _) in SHIPPED_DRAFTS.items() if t == name), None)
