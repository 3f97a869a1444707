"""A request and its five ledgers. Pure Python.

| ledger                    | meaning                                              | single writer                      |
|---------------------------|------------------------------------------------------|------------------------------------|
| output_token_ids          | tokens returned and committed                        | Scheduler.update_from_output       |
| num_output_placeholders   | scheduled positions whose tokens are not back yet    | AsyncScheduler (+), update (-)     |
| spec_token_ids            | drafts for the next verify; -1 while on the device   | scheduler (set / clear)            |
| num_computed_tokens (C)   | logical frontier, includes in-flight work            | scheduler (+n, -rejected, -trim)   |
| block_ids                 | KV blocks holding this request's cache               | KVCacheManager                     |
|   (+ group_block_ids)     | (the same for KV cache groups 1.. of a windowed model)|                                   |

Invariants (``check_invariants``; docs/SEMANTICS.md §2):
- PH >= 0; 0 <= C <= num_tokens + PH; C - PH <= num_tokens (the confirmed frontier never runs ahead of
  the known tokens; for a running request not mid-prefill it equals num_tokens - 1).
- a finished request holds no blocks, no placeholders and no drafts.
- enough blocks back every computed position: len(block_ids) * block_size >= C.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from typing import NamedTuple

from tandem.core.limits import remaining_tokens
from tandem.core.stats import SpecDecodingStats
from tandem.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 10
    FINISHED_LENGTH = 11
    FINISHED_ABORTED = 12
    FINISHED_ERROR = 13

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class InFlightStep(NamedTuple):
    """One scheduled step of this request whose output has not come back yet (immutable)."""

    step_id: int
    num_scheduled: int  # tokens computed by the step (C grew by this much)
    num_drafts: int  # draft slots among them
    samples: bool  # the step samples a token (it reaches the end of the known tokens)
    num_placeholders: int  # 1 + num_drafts when it samples, else 0: the outputs it promised
    tree: bool = False  # its drafts are verified as a tree (speculative_config.tree)


class InvariantError(AssertionError):
    """A ledger invariant does not hold: always a bug in tandem, never bad input."""


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        eos_token_ids: frozenset[int] = frozenset(),
        seed: int = 0,
        arrival_time: float | None = None,
        max_model_len: int | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt must contain at least one token")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        # Every request gets a seed (the user's, or one drawn by the engine) so that sampling is a pure
        # function of (seed, output position) and survives preemption, async and speculation.
        self.seed = sampling_params.seed if sampling_params.seed is not None else seed
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.max_model_len = max_model_len
        self.max_tokens = sampling_params.max_tokens
        self.status = RequestStatus.WAITING

        # -- the five ledgers -------------------------------------------------------------------------
        self.output_token_ids: list[int] = []
        self.num_output_placeholders = 0
        self.spec_token_ids: list[int] = []
        self.spec_tree = False  # its drafts on the device are a tree (speculative_config.tree), not a chain
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []  # written only by KVCacheManager (KV cache group 0)
        self.group_block_ids: list[list[int]] = []  # groups 1.. (sliding-window models); same writer
        # Steps in flight, oldest first: PH is exactly the sum of their placeholders (checked).
        self.inflight: deque[InFlightStep] = deque()

        # -- bookkeeping ----------------------------------------------------------------------------------
        self.block_hashes: list[int] = []  # chained hashes of full blocks of known tokens (no drafts)
        self.num_cached_tokens = -1  # prefix-cache hit length at first schedule (-1: not yet)
        self.num_preemptions = 0
        # Bumped at every preemption: outputs of steps scheduled under an older epoch are stale.
        self.epoch = 0
        self.stop_reason: int | str | None = None
        self.spec_stats = SpecDecodingStats()
        self.first_token_time: float | None = None
        self.first_scheduled_time: float | None = None  # set by the scheduler at the first admission
        self.finish_time: float | None = None
        # A drafter with its own KV skipped one of its prompt chunks (``SchedulerOutput.drafter_prefill``): its
        # drafts would attend over a gap in the prompt, so the adaptive policy never verifies any for it.
        self.drafter_gap = False

    # -- derived -----------------------------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus committed outputs; never drafts or placeholders."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def confirmed_frontier(self) -> int:
        return self.num_computed_tokens - self.num_output_placeholders

    @property
    def completed_frontier(self) -> int:
        """Tokens whose KV was written by steps that came back: C minus what is still in flight."""
        if not self.inflight:
            return self.num_computed_tokens
        return self.num_computed_tokens - sum(s.num_scheduled for s in self.inflight)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def token_at(self, index: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[index] if index < n else self.output_token_ids[index - n]

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens ``start .. end`` of prompt + outputs (slices, not a loop)."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def remaining_tokens(self) -> int:
        """How many more tokens may still be produced, counting those already in flight."""
        return remaining_tokens(self.num_tokens, len(self.prompt_token_ids), self.max_tokens, self.max_model_len,
                                self.num_output_placeholders)

    # -- invariants --------------------------------------------------------------------------------------
    def check_invariants(self, block_size: int | None = None) -> None:
        def fail(msg: str) -> None:
            raise InvariantError(f"request {self.request_id}: {msg}")

        ph, c = self.num_output_placeholders, self.num_computed_tokens
        if ph < 0:
            fail(f"negative placeholders ({ph})")
        if c < 0:
            fail(f"negative num_computed_tokens ({c})")
        if c - ph > self.num_tokens:
            fail(f"confirmed frontier {c - ph} beyond num_tokens {self.num_tokens}")
        # Never scheduled past a limit: each sampling step in flight guarantees one more token.
        sure = sum(1 for step in self.inflight if step.samples)
        if self.max_tokens is not None and len(self.output_token_ids) + sure > self.max_tokens:
            fail(f"scheduled past max_tokens: {len(self.output_token_ids)} out + {sure} in flight")
        if self.max_model_len is not None and self.num_tokens + sure > self.max_model_len:
            fail(f"scheduled past max_model_len: {self.num_tokens} tokens + {sure} in flight")
        expected_ph = sum(step.num_placeholders for step in self.inflight)
        if ph != expected_ph:
            fail(f"placeholders {ph} != {expected_ph} promised by the steps in flight")
        if not self.inflight and self.status == RequestStatus.RUNNING:
            mid_prefill = c < self.num_tokens - 1
            if not mid_prefill and c != self.num_tokens - 1:
                fail(f"idle running request: C={c} but num_tokens-1={self.num_tokens - 1}")
        if self.max_tokens is not None and len(self.output_token_ids) > self.max_tokens:
            fail(f"{len(self.output_token_ids)} outputs exceed max_tokens {self.max_tokens}")
        if self.max_model_len is not None and self.num_tokens > self.max_model_len:
            fail(f"num_tokens {self.num_tokens} exceeds max_model_len {self.max_model_len}")
        if self.is_finished:
            if self.block_ids or self.group_block_ids or ph or self.spec_token_ids or self.inflight:
                fail("finished request still holds blocks, placeholders or drafts")
            return
        if self.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            if ph:
                fail(f"waiting request has {ph} placeholders")
        if block_size is not None and len(self.block_ids) * block_size < c:
            fail(f"{len(self.block_ids)} blocks cannot hold {c} computed tokens")
        if block_size and len(self.block_hashes) > self.num_tokens // block_size:
            fail(f"{len(self.block_hashes)} block hashes for {self.num_tokens} known tokens")

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
            f"out={len(self.output_token_ids)}, C={self.num_computed_tokens}, "
            f"PH={self.num_output_placeholders}, spec={self.spec_token_ids}, blocks={len(self.block_ids)})"
        )
