"""One step sent to every tensor-parallel rank, one future back: the executor-side bookkeeping.

Every rank runs the same ``SchedulerOutput`` and samples the same tokens (logits are all-gathered,
sampling is keyed by position), so rank 0's ``ModelRunnerOutput`` is the step's output and the other
ranks only acknowledge (``RankAck``). A rank that fails or dies leaves the others out of lockstep (they
may be blocked in a collective), so with more than one rank any failure fails the executor: every
pending future gets an ``ExecutorError`` at once and later steps are refused. With one rank a failed
step fails only its own future, as before tensor parallelism.

Lockstep check (``debug_invariants``): every rank reports a digest of the tokens it sampled; the digests
of one step must agree, else the executor fails with "ranks diverged".

Used by the ``mp`` and ``ray`` executors; imports the executor layer's error type, nothing below it.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from tandem.core.interface import ModelRunnerOutput
from tandem.executor.base import ExecutorError


@dataclass(frozen=True)
class RankAck:
    """A rank other than 0 finished a step; ``digest`` of its sampled tokens when checking lockstep."""

    rank: int
    digest: str | None = None


def tokens_digest(sampled_token_ids: list[list[int]]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for row in sampled_token_ids:
        h.update(array("q", row).tobytes())
        h.update(b"|")
    return h.hexdigest()


def rank_reply(out: Any, rank: int, check_lockstep: bool) -> ModelRunnerOutput | RankAck:
    """What a rank sends back for a step: rank 0 its output, the others an acknowledgement."""
    if rank == 0:
        return out.materialize()
    digest = tokens_digest(out.materialize().sampled_token_ids) if check_lockstep else None
    return RankAck(rank, digest)


class StepFanout:
    def __init__(self, world_size: int, check_lockstep: bool = False) -> None:
        self.world_size = world_size
        self.check_lockstep = check_lockstep and world_size > 1
        self.dead: str | None = None
        self.steps_checked = 0  # steps whose digests all ranks reported and agreed on
        self._lock = threading.Lock()
        self._futures: dict[int, Future[ModelRunnerOutput]] = {}
        self._digests: dict[int, dict[int, str]] = {}

    def launch(self, step_id: int) -> Future[ModelRunnerOutput]:
        fut: Future[ModelRunnerOutput] = Future()
        with self._lock:
            if self.dead is None:
                self._futures[step_id] = fut
                return fut
            reason = self.dead
        fut.set_exception(ExecutorError(reason))
        return fut

    def output(self, step_id: int, out: ModelRunnerOutput) -> None:
        """Rank 0's result for ``step_id``."""
        if self.check_lockstep:
            self._digest(step_id, 0, tokens_digest(out.sampled_token_ids))
        with self._lock:
            fut = self._futures.pop(step_id, None)
        if fut is not None:
            fut.set_result(out)

    def ack(self, step_id: int, ack: RankAck) -> None:
        if self.check_lockstep and ack.digest is not None:
            self._digest(step_id, ack.rank, ack.digest)

    def step_failed(self, step_id: int, rank: int, error: str) -> None:
        if self.world_size == 1:
            with self._lock:
                fut = self._futures.pop(step_id, None)
            if fut is not None:
                fut.set_exception(ExecutorError(f"worker step failed: {error}"))
            return
        self.fail(f"worker rank {rank} failed step {step_id}: {error}")

    def forget(self, step_id: int) -> Future[ModelRunnerOutput] | None:
        with self._lock:
            return self._futures.pop(step_id, None)

    def fail(self, reason: str) -> None:
        """The executor is dead: fail every pending future; the first reason is kept."""
        with self._lock:
            if self.dead is None:
                self.dead = reason
            pending, self._futures = list(self._futures.values()), {}
            self._digests.clear()
        for fut in pending:
            fut.set_exception(ExecutorError(reason))

    def _digest(self, step_id: int, rank: int, digest: str) -> None:
        with self._lock:
            seen = self._digests.setdefault(step_id, {})
            seen[rank] = digest
            if len(seen) < self.world_size:
                return
            del self._digests[step_id]
            agree = len(set(seen.values())) == 1
            if agree:
                self.steps_checked += 1
        if not agree:
            self.fail(
                f"tensor-parallel ranks diverged at step {step_id}: sampled-token digests "
                f"{dict(sorted(seen.items()))}"
            )
