"""N-gram prompt lookup: propose the tokens that followed the most recent earlier occurrence of the
context's longest suffix n-gram (n from ``prompt_lookup_max`` down to ``prompt_lookup_min``).

Runs on the worker over a per-request token buffer kept on the model's device and extended in place
with each step's accepted tokens, so async scheduling needs no host copy of the context. One batched
tensor search per n for all requests: contexts are left-padded to a common width so every suffix ends
in the last column.
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.config import SpeculativeConfig
from tandem.spec_decode.proposer import ProposeInput, Proposer
from tandem.worker.request_state import RequestState

_PAD = -1


class _TokenBuffer:
    """A request's token history on the device, grown in place (amortised doubling)."""

    def __init__(self, device: torch.device) -> None:
        self.data = torch.empty(64, dtype=torch.int64, device=device)
        self.length = 0

    def sync(self, st: RequestState) -> None:
        """Append the tokens the runner committed since the last call (histories only grow)."""
        n = st.num_tokens
        if n > self.data.numel():
            grown = torch.empty(
                max(n, 2 * self.data.numel()), dtype=torch.int64, device=self.data.device
            )
            grown[: self.length] = self.data[: self.length]
            self.data = grown
        if n > self.length:
            new = torch.tensor(st.tokens(self.length, n), dtype=torch.int64)
            self.data[self.length : n] = new.to(self.data.device, non_blocking=True)
        self.length = n

    def view(self) -> torch.Tensor:
        return self.data[: self.length]


class NgramProposer(Proposer):
    method = "ngram"
    SUPPORTS_ASYNC_SCHEDULING = True

    def __init__(
        self, num_speculative_tokens: int, min_n: int, max_n: int, device: torch.device
    ) -> None:
        super().__init__(num_speculative_tokens)
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes must satisfy 1 <= min ({min_n}) <= max ({max_n})")
        self.min_n, self.max_n = min_n, max_n
        self.device = device
        self._buffers: dict[str, _TokenBuffer] = {}

    @classmethod
    def build(cls, config: SpeculativeConfig, *, target: Any, **_: Any) -> NgramProposer:
        return cls(config.num_speculative_tokens, config.ngram_min, config.ngram_max, target.device)

    def remove_requests(self, req_ids: set[str]) -> None:
        for rid in req_ids:
            self._buffers.pop(rid, None)

    def propose(self, inp: ProposeInput) -> list[list[int]]:
        contexts = []
        for st in inp.states:
            buf = self._buffers.get(st.req_id)
            if buf is None:
                buf = self._buffers[st.req_id] = _TokenBuffer(self.device)
            buf.sync(st)
            contexts.append(buf.view())
        return propose_ngram(contexts, self.min_n, self.max_n, inp.max_drafts)


def propose_ngram(
    contexts: list[torch.Tensor], min_n: int, max_n: int, max_drafts: list[int]
) -> list[list[int]]:
    """Batched prompt lookup. ``contexts[i]`` is request i's token history (1-D int64)."""
    if not contexts:
        return []
    width = max(int(c.numel()) for c in contexts)
    lengths = torch.tensor([int(c.numel()) for c in contexts], device=contexts[0].device)
    ctx = torch.full((len(contexts), width), _PAD, dtype=torch.int64, device=contexts[0].device)
    for i, c in enumerate(contexts):
        if c.numel():
            ctx[i, width - c.numel() :] = c
    found = torch.full((len(contexts),), -1, dtype=torch.int64, device=ctx.device)  # continuation start
    for n in range(max_n, min_n - 1, -1):
        if n >= width:
            continue
        windows = ctx.unfold(1, n, 1)[:, :-1]  # [B, width - n, n]: every earlier n-gram
        suffix = ctx[:, width - n :].unsqueeze(1)  # [B, 1, n]
        starts = torch.arange(windows.shape[1], device=ctx.device)
        valid = starts.unsqueeze(0) >= (width - lengths).unsqueeze(1)  # window inside the context
        match = (windows == suffix).all(-1) & valid & (lengths > n).unsqueeze(1)
        last = torch.where(match, starts, -1).max(dim=1).values  # most recent occurrence
        take = (found < 0) & (last >= 0)
        found = torch.where(take, last + n, found)
    out: list[list[int]] = []
    starts_host = found.tolist()
    for i, start in enumerate(starts_host):
        k = max_drafts[i]
        if start < 0 or k <= 0:
            out.append([])
            continue
        out.append(ctx[i, start : min(start + k, width)].tolist())
    return out
