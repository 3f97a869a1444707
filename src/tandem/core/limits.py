"""How many tokens a request may still produce, how many drafts are worth verifying, and whether a prompt fits:
the one place these limits are computed. The scheduler, the worker and the front end all call it.

A request stops at ``max_tokens`` outputs or when prompt + outputs reach ``max_model_len``, whichever comes
first. ``pending`` counts outputs already on their way (the scheduler's placeholders, or the sure token of
each sampling step in flight): they use up room as real outputs do. A verify step emits its accepted drafts
plus one token, so a request with ``r`` tokens of room gets at most ``r - 1`` drafts.

The functions take plain ints, or tensors with ``minimum=torch.minimum`` (the worker's exact per-slot caps
on the device): the same formula either way. No torch here (``core`` stays torch-free).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

UNBOUNDED = 1 << 40  # "no max_tokens": larger than any context


def remaining_tokens(
    num_tokens: Any, num_prompt_tokens: Any, max_tokens: Any, max_model_len: int | None, pending: Any = 0,
    minimum: Callable[[Any, Any], Any] = min,
) -> Any:
    """Tokens that may still be produced: never past ``max_tokens`` outputs or ``max_model_len`` tokens.
    ``max_tokens`` None (or ``UNBOUNDED``) means only the context bounds it; ``max_model_len`` None, only
    ``max_tokens``."""
    if max_tokens is None:
        max_tokens = UNBOUNDED
    if max_model_len is None:
        max_model_len = UNBOUNDED
    by_outputs = max_tokens - (num_tokens - num_prompt_tokens) - pending
    return minimum(by_outputs, max_model_len - num_tokens - pending)


def draft_slots(k: int, remaining: int) -> int:
    """Drafts worth verifying when ``remaining`` tokens may still come: a verify emits drafts + 1."""
    return max(0, min(k, remaining - 1))


def prompt_fits(num_prompt_tokens: int, max_model_len: int) -> bool:
    """A prompt must leave room for at least one output token."""
    return 0 < num_prompt_tokens < max_model_len
