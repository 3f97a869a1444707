"""``uni``: the runner lives in the engine process and executes on one worker thread.

The engine thread submits step N+1 while the worker thread runs step N; torch releases the GIL inside its
kernels, so scheduling (pure Python) overlaps the forward pass. Steps run strictly in submission order.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.execution import built_execution
from tandem.executor.base import Executor
from tandem.model.loader import Checkpoint
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.model_runner import ModelRunner
from tandem.worker.pending import PendingStep
from tandem.worker.worker import WorkerSpec, build_runner


# How long the engine thread waits for the next step's forward to start before it goes on regardless.
LAUNCH_WAIT_S = 0.05


class _Step:
    """One submitted step as the engine waits for it: the worker's future, and an event set when the step's
    forward starts (or the step ends without one).

    ``result`` materializes the step's ``PendingStep`` (reads its host copy) on the engine's thread, so the
    worker thread goes on to the next step at once. Before that, if the next step is already queued, the
    engine thread waits (GIL released) until the worker has built that step's inputs and entered its
    forward: the engine's output processing and scheduling then run under the forward instead of contending
    for the GIL with the worker's input preparation, which is on the critical path."""

    __slots__ = ("future", "launched", "next")

    def __init__(self) -> None:
        self.future: Future[PendingStep] | None = None
        self.launched = threading.Event()
        self.next: _Step | None = None  # the step submitted after this one, if any yet

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        assert self.future is not None
        pending = self.future.result(timeout)
        if self.next is not None:
            self.next.launched.wait(LAUNCH_WAIT_S)
        return pending.materialize()

    def done(self) -> bool:
        return self.future is not None and self.future.done()


class UniProcExecutor(Executor):
    name = "uni"
    SUPPORTS_ASYNC_SCHEDULING = True

    def __init__(self, runner: ModelRunner, pool: ThreadPoolExecutor) -> None:
        self.runner = runner
        self._pool = pool
        self._last: _Step | None = None  # the step submitted last

    @classmethod
    def create(
        cls, spec: WorkerSpec, *, checkpoint: Checkpoint | None = None, tracer: Tracer = NULL_TRACER
    ) -> UniProcExecutor:
        # Build the model on the worker thread too: torch's OpenMP thread team belongs to the thread
        # that first runs a parallel op, and a second team (one per calling thread) would oversubscribe
        # the cores. Measured here: forward on a fresh thread after building on the main one ran
        # 20-30 % slower.
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-worker")
        runner = pool.submit(build_runner, spec, checkpoint, tracer).result()
        executor = cls(runner, pool)
        executor.worker_execution = [built_execution(runner.model)]
        return executor

    def execute_model(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        step = _Step()
        if self._last is not None:
            self._last.next = step
        self._last = step
        step.future = self._pool.submit(self._run, scheduler_output, step.launched)
        return step  # type: ignore[return-value]

    def _run(self, scheduler_output: SchedulerOutput, launched: threading.Event) -> PendingStep:
        self.runner.on_forward = launched.set
        try:
            return self.runner.execute_model(scheduler_output)
        finally:
            launched.set()

    def abandon(self, req_ids: list[str]) -> None:
        self.runner.abandon(req_ids)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
