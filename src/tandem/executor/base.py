"""Executor interface: runs a ``SchedulerOutput`` on the model runner and hands back a future.

Each backend declares whether it supports async scheduling (``SUPPORTS_ASYNC_SCHEDULING``); the async
decision reads that declaration, so the capability matrix lives with the code it describes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import TYPE_CHECKING, ClassVar

from tandem.async_decision import AsyncCapability, AsyncReason
from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.trace.tracer import NULL_TRACER, Tracer

if TYPE_CHECKING:
    from tandem.model.loader import Checkpoint
    from tandem.worker.worker import WorkerSpec


class ExecutorError(RuntimeError):
    """The executor (worker thread or process) failed; the engine must fail in-flight requests."""


class Executor(ABC):
    name: ClassVar[str]
    SUPPORTS_ASYNC_SCHEDULING: ClassVar[bool] = False
    ASYNC_FIX: ClassVar[str] = "use executor_backend 'uni' or 'mp'"
    SUPPORTS_TENSOR_PARALLEL: ClassVar[bool] = False  # one worker per rank (tensor_parallel_size > 1)
    # What each rank's worker built (tandem.execution.built_execution), as it reported at start-up.
    worker_execution: list[dict[str, object]] = []

    @classmethod
    def async_capability(cls) -> AsyncCapability:
        return AsyncCapability(
            kind="executor",
            name=f"executor {cls.name!r}",
            supported=cls.SUPPORTS_ASYNC_SCHEDULING,
            reason=AsyncReason.UNSUPPORTED_EXECUTOR,
            fix=cls.ASYNC_FIX,
        )

    @classmethod
    def create(
        cls, spec: WorkerSpec, *, checkpoint: Checkpoint | None = None, tracer: Tracer = NULL_TRACER
    ) -> Executor:
        """Build the executor and its runner from plain data (a loaded checkpoint may be reused)."""
        raise TypeError(f"executor {cls.name!r} cannot be built by the engine (test-only executor)")

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        """Launch one step; returns at once. Steps run in submission order."""

    def abandon(self, req_ids: list[str]) -> None:  # noqa: B027 - optional hook
        """The engine aborted ``req_ids`` while steps that hold them may still be queued: a worker may skip
        a queued step that computes nothing else (``ModelRunner.abandon``). Ranks of a tensor-parallel group
        must skip alike, so executors with several ranks ignore it."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        pass

    def check_health(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
