"""Grammar bitmasks for verify rows, and applying them to logits.

A request verifying drafts d_1..d_k owns k + 1 logits rows; row j predicts the token after the
committed outputs plus d_1..d_j, so its mask is the grammar's allowed set in that state:

    fill row 0 (committed state)
    for j in 1..k:  accept d_j into the matcher; if the grammar refuses it, cut d_j.. (they become
                    -1, i.e. rejected without a look, and are counted as invalid); else fill row j
    roll the matcher back by the number of drafts it accepted          -> committed state again

Rows past a cut keep an all-ones mask: the rejection sampler never emits from them (it emits at most
valid + 1 tokens). A draft stop token (EOS) ends the check: the drafts after it are cut and its
next row is left open, as the scheduler drops whatever follows a stop.

The mask is xgrammar's packed int32 layout ([R, ceil(V / 32)], bit i of word w = token 32 w + i, 1 =
allowed). Unpacking and masking are plain torch ops on the logits' device (the CPU reference path).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem.structured.grammar import RequestGrammar

_FULL = -1  # all 32 bits set


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """[R, ceil(V / 32)] int32, every token allowed."""
    return torch.full((num_rows, -(-vocab_size // 32)), _FULL, dtype=torch.int32)


def fill_verify_rows(
    grammar: RequestGrammar, drafts: Sequence[int], bitmask: torch.Tensor, first_row: int
) -> int:
    """Fill rows ``first_row .. first_row + len(drafts)`` and return how many leading drafts the
    grammar accepts. The matcher ends where it started (the committed state)."""
    if not grammar.active:
        return len(drafts)  # unconstrained (finished grammar or dropped constraint)
    m = grammar.matcher
    m.fill_next_token_bitmask(bitmask, first_row)
    accepted = 0
    for j, tok in enumerate(drafts):
        # The row's mask says whether the draft is allowed; asking the matcher only then keeps
        # xgrammar from logging a warning for every drafted special token.
        if not _allowed(bitmask, first_row + j, int(tok)) or not m.accept_token(int(tok)):
            break
        accepted += 1
        if m.is_terminated():
            break  # the draft is a stop token: whatever follows it is dropped anyway
        m.fill_next_token_bitmask(bitmask, first_row + j + 1)
    if accepted:
        m.rollback(accepted)
    return accepted


def _allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    if not 0 <= token < bitmask.shape[1] * 32:
        return False
    return bool((int(bitmask[row, token >> 5]) >> (token & 31)) & 1)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, W] packed int32 -> [R, V] bool (True = allowed)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int] | None = None
) -> torch.Tensor:
    """``logits`` [N, V] with ``-inf`` where the mask bit is 0, in place; returns ``logits``.

    ``bitmask`` [N, W] (host or device); ``rows``: only these rows (None: all)."""
    if rows is not None and not rows:
        return logits
    vocab = logits.shape[1]
    if rows is not None:
        bitmask = bitmask[torch.tensor(list(rows), dtype=torch.int64)]
    allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), vocab)
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        idx = torch.tensor(list(rows), dtype=torch.int64).to(logits.device, non_blocking=True)
        logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
    return logits


class VerifyMasks:
    """The masks of one step's sampled rows, and the drafts the grammars let through."""

    def __init__(self, bitmask: torch.Tensor | None, rows: list[int], num_valid: list[int]) -> None:
        self.bitmask = bitmask  # [R, W] over all rows of the step; None: nothing constrained
        self.rows = rows  # the rows that carry a mask
        self.num_valid = num_valid  # per request: leading drafts the grammar accepts

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.bitmask is None:
            return logits
        return apply_bitmask(logits, self.bitmask, self.rows)


def build_verify_masks(
    grammars: Sequence[RequestGrammar | None],
    drafts: Sequence[Sequence[int]],
    num_rows: Sequence[int],
    vocab_size: int,
) -> VerifyMasks:
    """Request i owns ``num_rows[i]`` consecutive rows (its drafts' slots + 1) and verifies
    ``drafts[i]`` (its valid drafts, no placeholders); unconstrained requests pass ``None``."""
    num_valid = [len(d) for d in drafts]
    if not any(g is not None and g.active for g in grammars):
        return VerifyMasks(None, [], num_valid)
    bitmask = allocate_bitmask(sum(num_rows), vocab_size)
    rows: list[int] = []
    start = 0
    for i, (g, d, n) in enumerate(zip(grammars, drafts, num_rows)):
        if g is not None and g.active:
            num_valid[i] = fill_verify_rows(g, d, bitmask, start)
            rows.extend(range(start, start + min(num_valid[i] + 1, n)))
        start += n
    return VerifyMasks(bitmask, rows, num_valid)
