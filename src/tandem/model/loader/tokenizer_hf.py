"""Building tandem's ``Tokenizer`` from a Hugging Face model directory.

Files read: ``tokenizer.json`` (required: vocabulary, merges, normalizer, pre-tokenizer, decoder,
added tokens), ``tokenizer_config.json`` (special-token strings, ``add_bos_token`` /
``add_eos_token``, maybe ``chat_template``), ``chat_template.jinja`` (where transformers >= 4.50
saves the template; it wins over the one in ``tokenizer_config.json``), and the ``eos_token_id``
of ``generation_config.json`` and ``config.json``, which join the set of stop tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers

from tandem.model.loader.chat_template import ChatTemplate
from tandem.model.loader.hf import generation_eos_ids, read_json
from tandem.model.loader.tokenizer import SpecialTokens, Tokenizer


def _token_string(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` spells it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(directory: Path, config: dict[str, Any]) -> ChatTemplate | None:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return ChatTemplate(jinja_file.read_text(encoding="utf-8"), str(jinja_file))
    origin = f"{directory / 'tokenizer_config.json'}: chat_template"
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None:
        return None
    if not isinstance(template, str):
        raise ValueError(f"{origin} must be a string or a list of named templates")  # noqa: TRY004
    return ChatTemplate(template, origin)


def _is_byte_level(spec: dict[str, Any]) -> bool:
    decoder = spec.get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return any(p.get("type") == "ByteLevel" for p in parts)


def hf_tokenizer(directory: Path) -> Tokenizer:
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{directory}: no tokenizer.json (tandem does not convert sentencepiece tokenizers)"
        )
    text = path.read_text(encoding="utf-8")
    try:
        spec = json.loads(text)
        backend = tokenizers.Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise ValueError(f"{path}: cannot be read as a tokenizer ({exc})") from exc
    config_path = directory / "tokenizer_config.json"
    config = read_json(config_path) if config_path.is_file() else {}

    def token_id(key: str) -> int | None:
        token = _token_string(config.get(key))
        if token is None:
            return None
        found = backend.token_to_id(token)
        if found is None:
            raise ValueError(f"{config_path}: {key} {token!r} is not in {path.name}")
        return found

    # Stop tokens in order of authority; the first one is the eos_token_id.
    stops = [token_id("eos_token"), *generation_eos_ids(directory)]
    model_config = directory / "config.json"
    if model_config.is_file():
        model_eos = read_json(model_config).get("eos_token_id")
        stops += model_eos if isinstance(model_eos, list) else [model_eos]
    stop_ids = [int(i) for i in stops if i is not None]
    eos = stop_ids[0] if stop_ids else None
    explicit = "add_bos_token" in config or "add_eos_token" in config
    specials = SpecialTokens(
        bos_token_id=token_id("bos_token"),
        eos_token_id=eos,
        eos_token_ids=frozenset(stop_ids),
        pad_token_id=token_id("pad_token"),
        unk_token_id=token_id("unk_token"),
        add_bos=bool(config.get("add_bos_token", False)),
        add_eos=bool(config.get("add_eos_token", False)),
        backend_post_processor=not explicit,
    )
    return Tokenizer(
        backend,
        specials,
        _chat_template(directory, config),
        byte_level=_is_byte_level(spec),
        name=str(directory),
    )
