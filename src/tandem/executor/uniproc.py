"""``uni``: the runner lives in the engine process and executes on one worker thread.

The engine thread submits step N+1 while the worker thread runs step N; torch releases the GIL inside its
kernels, so scheduling (pure Python) overlaps the forward pass. Steps run strictly in submission order.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.execution import built_execution
from tandem.executor.base import Executor
from tandem.model.loader import Checkpoint
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.model_runner import ModelRunner
from tandem.worker.pending import PendingStep
from tandem.worker.worker import WorkerSpec, build_runner


class _Step(NamedTuple):
    """One submitted step as the engine waits for it: ``result`` materializes the worker's ``PendingStep``
    (reads its host copy) on the engine's thread, so the worker thread goes on to the next step at once."""

    future: Future[PendingStep]

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        return self.future.result(timeout).materialize()

    def done(self) -> bool:
        return self.future.done()


class UniProcExecutor(Executor):
    name = "uni"
    SUPPORTS_ASYNC_SCHEDULING = True

    def __init__(self, runner: ModelRunner, pool: ThreadPoolExecutor) -> None:
        self.runner = runner
        self._pool = pool

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
        return _Step(self._pool.submit(self.runner.execute_model, scheduler_output))  # type: ignore[return-value]

    def abandon(self, req_ids: list[str]) -> None:
        self.runner.abandon(req_ids)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
