"""``mp``: the runner lives in a worker process; typed messages over a pipe.

The engine sends ``Execute`` messages in step order and gets ``Result`` / ``StepFailed`` back in the same
order; a reader thread resolves the futures. If the worker dies (crash, kill, OOM), the reader sees the
pipe close, fails every pending future with ``ExecutorError`` naming the exit code, and the engine fails
the affected requests and shuts down cleanly instead of hanging.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import traceback
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.executor.base import Executor, ExecutorError
from tandem.trace.tracer import NULL_TRACER, Span, Tracer
from tandem.worker.worker import WorkerSpec

START_TIMEOUT_S = 600.0


# -- messages ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Execute:
    scheduler_output: SchedulerOutput


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class StartFailed:
    error: str


@dataclass(frozen=True)
class Result:
    output: ModelRunnerOutput
    spans: list[Span] = field(default_factory=list)


@dataclass(frozen=True)
class StepFailed:
    error: str


def _worker_main(spec: WorkerSpec, conn: Connection, threads: int | None) -> None:
    import torch

    from tandem.worker.worker import build_runner

    if threads:
        torch.set_num_threads(threads)
    tracer = Tracer("tandem-worker") if spec.trace else NULL_TRACER
    try:
        runner = build_runner(spec, tracer=tracer)
    except BaseException as exc:  # report, then exit
        conn.send(StartFailed(f"{exc!r}\n{traceback.format_exc()}"))
        return
    conn.send(Ready(mp.current_process().pid or 0))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the engine went away
        if isinstance(msg, Shutdown):
            return
        if isinstance(msg, Execute):
            try:
                out = runner.execute_model(msg.scheduler_output)
            except Exception as exc:
                conn.send(StepFailed(f"{exc!r}\n{traceback.format_exc()}"))
                continue
            conn.send(Result(out, tracer.take() if spec.trace else []))


class MultiprocExecutor(Executor):
    name = "mp"
    SUPPORTS_ASYNC_SCHEDULING = True

    def __init__(self, spec: WorkerSpec, tracer: Tracer = NULL_TRACER) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.tracer = tracer
        self.process = ctx.Process(
            target=_worker_main,
            args=(spec, child, spec.config.parallel.worker_threads),
            name="tandem-worker",
            daemon=True,
        )
        self.process.start()
        child.close()
        self._pending: deque[Future[ModelRunnerOutput]] = deque()
        self._lock = threading.Lock()
        self._dead: str | None = None
        self._closing = False
        if not self._conn.poll(START_TIMEOUT_S):
            self.shutdown()
            raise ExecutorError("worker process did not start in time")
        try:
            first = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise ExecutorError(f"worker process exited at start-up ({self.process.exitcode})") from exc
        if isinstance(first, StartFailed):
            self.process.join(5)
            raise ExecutorError(f"worker process failed to start: {first.error}")
        self._reader = threading.Thread(target=self._read_loop, name="tandem-mp-reader", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                fut = self._pending.popleft() if self._pending else None
            if fut is None:
                continue
            if isinstance(msg, Result):
                self.tracer.extend(msg.spans)
                fut.set_result(msg.output)
            elif isinstance(msg, StepFailed):
                fut.set_exception(ExecutorError(f"worker step failed: {msg.error}"))
        self.process.join(1.0)
        reason = (
            "worker process shut down" if self._closing
            else f"worker process died (exit code {self.process.exitcode})"
        )
        with self._lock:
            self._dead = reason
            pending, self._pending = list(self._pending), deque()
        for fut in pending:
            fut.set_exception(ExecutorError(reason))

    def execute_model(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        fut: Future[ModelRunnerOutput] = Future()
        with self._lock:
            if self._dead is not None:
                fut.set_exception(ExecutorError(self._dead))
                return fut
            self._pending.append(fut)
        try:
            self._conn.send(Execute(scheduler_output))
        except (BrokenPipeError, OSError) as exc:
            with self._lock:
                if fut in self._pending:
                    self._pending.remove(fut)
            fut.set_exception(ExecutorError(f"worker process unreachable: {exc!r}"))
        return fut

    def check_health(self) -> None:
        if self._dead is not None or not self.process.is_alive():
            raise ExecutorError(self._dead or f"worker process died ({self.process.exitcode})")

    def shutdown(self) -> None:
        self._closing = True
        if self.process.is_alive():
            try:
                self._conn.send(Shutdown())
            except (BrokenPipeError, OSError):
                pass
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        try:
            self._conn.close()
        except OSError:
            pass
