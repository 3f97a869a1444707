"""Bad words: token sequences a request must never produce.

A bad word is banned as the token sequences it can appear as: the word at the start of a text and the
word after a space (byte-level BPE vocabularies spell the two differently, ``hello`` vs ``Ġhello``).
A sequence ``s`` of length L is banned at a logits row by masking its last token when the row's
context already ends with its first L - 1 tokens; a one-token word is masked on every row. So a
multi-token word is cut at its last token, never emitted whole.

A row's context is the request's committed outputs plus, on verify row j, the first j draft tokens
(vLLM uses the outputs, not the prompt). Negative ids are placeholders for tokens not known on the
host; they equal no token id, so a context whose tail holds one never matches. Pure Python: the
sampler turns the result into a sparse ``-inf`` ban.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

BadWordIds = tuple[tuple[int, ...], ...]


def tokenize_bad_words(words: Sequence[str], encode: Callable[[str], list[int]]) -> BadWordIds:
    """Each word's token sequences, without and with a leading space (deduplicated, in order).

    ``encode`` must not add special tokens. A word is stripped of leading whitespace first, so
    ``" foo"`` and ``"foo"`` ban the same sequences.
    """
    out: list[tuple[int, ...]] = []
    for word in words:
        core = word.lstrip()
        if not core:
            continue
        for text in (core, " " + core):
            ids = tuple(encode(text))
            if ids and ids not in out:
                out.append(ids)
    return tuple(out)


def _tail(context: Sequence[int] | torch.Tensor, n: int) -> list[int]:
    if n == 0:
        return []
    if isinstance(context, torch.Tensor):
        return [int(t) for t in context.reshape(-1)[-n:].tolist()]
    return [int(t) for t in context[-n:]]


def banned_tokens(context: Sequence[int] | torch.Tensor, words: BadWordIds) -> list[int]:
    """Token ids to mask at a row whose context is ``context`` (sorted, unique)."""
    banned: set[int] = set()
    longest = max((len(w) for w in words), default=0)
    tail = _tail(context, longest - 1) if longest > 1 else []
    for seq in words:
        prefix = seq[:-1]
        if not prefix:
            banned.add(seq[-1])
        elif len(tail) >= len(prefix) and tail[len(tail) - len(prefix) :] == list(prefix):
            banned.add(seq[-1])
    return sorted(banned)


__all__ = ["BadWordIds", "banned_tokens", "tokenize_bad_words"]
