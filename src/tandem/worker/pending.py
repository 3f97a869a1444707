"""A step's results while they are still device tensors, and their one-time copy to the host.

``PendingStep`` is what every step of the runner returns: what the step produced on the device (sampled
tokens, next drafts, logprobs) and the copy to the host, started at once (on CUDA asynchronously, into
pinned memory, with an event; waiting for it is the step's only sync). The copy is read once, by whoever
needs it first: the runner reconciling its host records (at the end of the step, or after the next step's
launch under deferred reconciliation), or the engine / the mp sender thread materializing the
``ModelRunnerOutput``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from tandem.core.interface import ModelRunnerOutput, TokenLogprobs
from tandem.sample.sampler import LogprobsTensors
from tandem.worker.input_prep import RequestPlan


def _start_copy(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cuda":
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host
    return t


def _start_copies(lp: LogprobsTensors) -> LogprobsTensors:
    return LogprobsTensors(*(_start_copy(t) for t in lp))


@dataclass
class PromptLogprobs:
    """One request's prompt logprobs from one step, as tensors: converted only at materialization,
    so asking for them adds no host sync to the step."""

    first: int  # position before the first target token (0: the entries start with a None)
    targets: list[int]  # the prompt tokens whose logprobs these are
    n: int  # top-n alternatives
    tensors: LogprobsTensors

    def entries(self) -> list[TokenLogprobs | None]:
        ids, vals = self.tensors.logprob_token_ids.tolist(), self.tensors.logprobs.tolist()
        ranks = self.tensors.selected_token_ranks.tolist()
        out: list[TokenLogprobs | None] = [None] if self.first == 0 else []
        n = self.n
        out += [
            TokenLogprobs(t, vals[j][0], ranks[j], ids[j][1 : n + 1], vals[j][1 : n + 1])
            for j, t in enumerate(self.targets)
        ]
        return out


@dataclass
class PendingStep:
    step_id: int
    req_ids: list[str]  # every request of the step, batch order
    sampling: list[RequestPlan]  # the ones that sampled, in the rows of ``sampled``
    sampled: torch.Tensor  # [B, K+1] int64, -1 padded (accepted drafts + one token)
    drafts: torch.Tensor | None  # [B, k] next drafts, -1 padded; None without speculation
    num_valid: list[int]  # valid draft slots verified this step, per sampling request
    logprobs: LogprobsTensors | None
    prompt_logprobs: dict[str, PromptLogprobs]
    send_drafts: bool  # sync scheduling: drafts travel to the host scheduler
    tokens_applied: bool = False  # a host-side proposer already applied the tokens to the host records
    num_invalid: list[int] | None = None  # drafts cut by a grammar, per sampling request
    pooled: dict[str, torch.Tensor] = field(default_factory=dict)  # pooling runner: req_id -> [hidden]
    # Shadow drafts (core/shadow.py): the requests' ids and their [S, k] drafts (-1 padded), not verified.
    shadow: tuple[list[str], torch.Tensor] | None = None
    _host: tuple[list[list[int]], list[list[int]] | None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _event: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._sampled_h, self._drafts_h, self._logprobs_h = self.sampled, self.drafts, self.logprobs
        if self.sampled.device.type == "cuda":  # on the CPU the tensors are their own host copy
            self._sampled_h = _start_copy(self.sampled)
            self._drafts_h = _start_copy(self.drafts) if self.drafts is not None else None
            if self.shadow is not None:
                self.shadow = (self.shadow[0], _start_copy(self.shadow[1]))
            # Logprobs travel with the sampled ids (same event), not in a later blocking copy.
            self._logprobs_h = _start_copies(self.logprobs) if self.logprobs is not None else None
            for plp in self.prompt_logprobs.values():
                plp.tensors = _start_copies(plp.tensors)
            event = torch.cuda.Event()
            event.record()
            self._event = event

    @classmethod
    def empty(cls, device: torch.device) -> PendingStep:
        """A step that computed nothing (empty, or only abandoned requests)."""
        return cls(step_id=-1, req_ids=[], sampling=[], sampled=torch.empty(0, 1, dtype=torch.int64, device=device),
                   drafts=None, num_valid=[], logprobs=None, prompt_logprobs={}, send_drafts=False)

    def host(self) -> tuple[list[list[int]], list[list[int]] | None]:
        """Sampled tokens per request (no padding) and next drafts per request (valid prefix)."""
        with self._lock:
            if self._host is None:
                if self._event is not None:
                    self._event.synchronize()  # type: ignore[attr-defined]
                sampled = [[t for t in row if t >= 0] for row in self._sampled_h.tolist()]
                drafts = None
                if self._drafts_h is not None:
                    drafts = []
                    for row in self._drafts_h.tolist():
                        n = 0
                        while n < len(row) and row[n] >= 0:
                            n += 1
                        drafts.append(row[:n])
                self._host = (sampled, drafts)
            return self._host

    def materialize(self) -> ModelRunnerOutput:
        sampled, drafts = self.host()
        by_req = {p.req_id: i for i, p in enumerate(self.sampling)}
        logprobs = None
        if self._logprobs_h is not None:
            logprobs = _logprob_entries(self.sampling, sampled, self._logprobs_h)
        return ModelRunnerOutput(
            req_ids=list(self.req_ids),
            sampled_token_ids=[sampled[by_req[r]] if r in by_req else [] for r in self.req_ids],
            spec_token_ids=(
                [drafts[by_req[r]] if r in by_req else [] for r in self.req_ids]
                if self.send_drafts and drafts is not None
                else None
            ),
            num_valid_drafts=[self.num_valid[by_req[r]] if r in by_req else 0 for r in self.req_ids],
            num_invalid_spec_tokens=(
                [self.num_invalid[by_req[r]] if r in by_req else 0 for r in self.req_ids]
                if self.num_invalid and any(self.num_invalid)
                else None
            ),
            logprobs=(
                [logprobs[by_req[r]] if r in by_req else [] for r in self.req_ids]
                if logprobs is not None
                else None
            ),
            prompt_logprobs={rid: plp.entries() for rid, plp in self.prompt_logprobs.items()},
            pooled={rid: v.float().cpu().tolist() for rid, v in self.pooled.items()},
            shadow_token_ids=(
                {rid: [t for t in row if t >= 0] for rid, row in zip(self.shadow[0], self.shadow[1].tolist())}
                if self.shadow is not None
                else {}
            ),
        )


def _logprob_entries(
    plans: list[RequestPlan], sampled: list[list[int]], lp: LogprobsTensors
) -> list[list[TokenLogprobs]]:
    ids, vals = lp.logprob_token_ids.tolist(), lp.logprobs.tolist()
    ranks = lp.selected_token_ranks.tolist()
    out, row = [], 0
    for p, toks in zip(plans, sampled):
        n = p.state.sampling_params.logprobs
        entries = []
        if n is not None:
            for j, tok in enumerate(toks):
                r = row + j
                entries.append(TokenLogprobs(tok, vals[r][0], ranks[r], ids[r][1 : n + 1], vals[r][1 : n + 1]))
        out.append(entries)
        row += len(p.sample_rows)  # (a tree verify's root and nodes; a chain's k + 1)
    return out
