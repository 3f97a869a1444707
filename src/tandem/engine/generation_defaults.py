"""Requests' default sampling parameters: vLLM's ``generation_config`` / ``override_generation_config``.

``auto`` (the default) reads the checkpoint's ``generation_config.json`` — for an HF directory; a GGUF file has
none — ``vllm`` reads nothing, anything else is a folder that must hold one. Only the fields vLLM takes from it
become defaults: temperature, top_p, top_k, min_p, repetition_penalty, and max_new_tokens (as max_tokens).
``override_generation_config`` goes on top. ``LLM.get_default_sampling_params()`` and a ``generate`` /
``chat`` call without sampling params use them; the server uses them for the fields a request leaves out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.config import ModelConfig

_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
           "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def generation_defaults(model: ModelConfig) -> dict[str, Any]:
    """The default ``SamplingParams`` keywords; a bad folder or override is a ``ValueError`` naming it."""
    from tandem.model.loader.registry import resolve_model
    from tandem.sampling_params import SamplingParams

    out: dict[str, Any] = {}
    where = model.generation_config
    if where != "vllm":
        folder = resolve_model(model.model) if where == "auto" else Path(where).expanduser()
        path = folder / "generation_config.json" if folder.is_dir() else None
        if where != "auto" and (path is None or not path.is_file()):
            raise ValueError(f"generation_config={where!r}: no generation_config.json in that folder")
        if path is not None and path.is_file():
            try:
                raw = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"generation_config: {path} is not valid JSON: {exc}") from exc
            out = {_FIELDS[k]: v for k, v in raw.items() if k in _FIELDS and v is not None}
    for key, value in (model.override_generation_config or {}).items():
        out[_FIELDS.get(key, key)] = value
    try:
        SamplingParams(**out)
    except ValueError as exc:
        raise ValueError(f"generation_config / override_generation_config: {exc}") from exc
    return out
