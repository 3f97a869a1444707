"""The proposer interface: every drafting method sits behind it; verification is separate.

A proposer runs on the worker right after the target step has sampled, sees the runner's request states
(already holding the tokens just accepted) and the target's hidden states, and returns up to k drafts per
request. With async scheduling the drafts stay in the worker (``RequestState.drafts``) and the host only
sees ``-1`` slots; with sync scheduling they also travel to the host in ``ModelRunnerOutput``.

Each proposer class declares whether it supports async scheduling; the async decision reads that.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from tandem.async_decision import AsyncCapability, AsyncReason
from tandem.model.forward_batch import ForwardBatch
from tandem.worker.request_state import RequestState


@dataclass
class ProposeInput:
    """What the target step leaves for the proposer, for the requests that sampled this step."""

    states: list[RequestState]  # tokens already include this step's accepted + bonus tokens
    num_accepted: list[int]  # accepted drafts per request this step
    max_drafts: list[int]  # exact per-request cap (max_tokens / max_model_len)
    batch: ForwardBatch  # the target step's batch
    # Target hidden states for each request's last fed rows (EAGLE / MTP read them), keyed by layer id
    # (-1 = final normed output), rows aligned with ``sample_rows``.
    hidden_states: dict[int, torch.Tensor]
    sample_rows: list[list[int]]
    # Requests that advanced this step without sampling (prefill chunks): drafters with their own KV
    # catch up on them so a prefix cached later is valid for the draft too.
    prefill_states: list[RequestState] = field(default_factory=list)


class Proposer(ABC):
    method: ClassVar[str]
    SUPPORTS_ASYNC_SCHEDULING: ClassVar[bool] = True
    # Target layers whose residual stream the proposer needs (EAGLE-3); empty for most.
    aux_hidden_layers: tuple[int, ...] = ()
    # Whether the proposer writes its own KV at positions beyond the target's (draft models): the
    # scheduler then reserves k lookahead slots.
    needs_lookahead_slots: ClassVar[bool] = False

    def __init__(self, num_speculative_tokens: int) -> None:
        self.k = num_speculative_tokens

    @classmethod
    def async_capability(cls) -> AsyncCapability:
        return AsyncCapability(
            kind="speculative",
            name=f"speculative method {cls.method!r}",
            supported=cls.SUPPORTS_ASYNC_SCHEDULING,
            reason=AsyncReason.UNSUPPORTED_SPEC_METHOD,
            fix="set async_scheduling to None (auto) or False, or choose another method",
        )

    @abstractmethod
    def propose(self, inp: ProposeInput) -> list[list[int]]:
        """Drafts per request (each at most ``inp.max_drafts[i]`` long; may be shorter or empty)."""

    def remove_requests(self, req_ids: set[str]) -> None:  # noqa: B027 - optional hook
        """Forget per-request state (finished / preempted)."""
