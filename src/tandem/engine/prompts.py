"""Prompt inputs in vLLM's forms: a string, ``{"prompt": str}``, or ``{"prompt_token_ids": [...]}`` (vLLM's
``multi_modal_data`` key taken when empty)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from tandem.model.loader import Tokenizer

PromptInput = Union[str, dict[str, Any], Sequence[Union[str, dict[str, Any]]]]


@dataclass(frozen=True)
class Prompt:
    text: str | None
    ids: tuple[int, ...] | None
    add_special_tokens: bool = True

    def token_ids(self, tokenizer: Tokenizer) -> list[int]:
        if self.ids is not None:
            return list(self.ids)
        assert self.text is not None
        return tokenizer.encode(self.text, add_special_tokens=self.add_special_tokens)


def _one(p: Any) -> Prompt:
    if isinstance(p, str):
        return Prompt(p, None)
    if isinstance(p, dict):
        unknown = sorted(set(p) - {"prompt", "prompt_token_ids", "add_special_tokens", "multi_modal_data"})
        if unknown:
            raise ValueError(f"unknown prompt field(s) {unknown}")
        if p.get("multi_modal_data"):  # vLLM's key; None / empty (a text-only prompt) is fine
            raise ValueError("multi_modal_data: images and other media are not supported (text-only models)")
        if "prompt_token_ids" in p:
            ids = p["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise ValueError("prompt_token_ids must be a list of integers")
            return Prompt(p.get("prompt"), tuple(ids))
        if isinstance(p.get("prompt"), str):
            return Prompt(p["prompt"], None, bool(p.get("add_special_tokens", True)))
    raise ValueError(
        "a prompt must be a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
        f"got {type(p).__name__}"
    )


def normalize_prompts(prompts: PromptInput) -> list[Prompt]:
    if isinstance(prompts, (str, dict)):
        return [_one(prompts)]
    out = [_one(p) for p in prompts]
    if not out:
        raise ValueError("no prompts given")
    return out
