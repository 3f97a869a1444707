"""``mp``: the runner lives in a worker process; typed messages over a private Unix socket.

The engine sends ``Execute`` messages in step order and gets ``Result`` / ``StepFailed`` back in the same
order; a reader thread resolves the futures. If the worker dies (crash, kill, OOM), the reader sees the
pipe close, fails every pending future with ``ExecutorError`` naming the exit code, and the engine fails
the affected requests and shuts down cleanly instead of hanging.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from multiprocessing.connection import Connection, Listener

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.executor.base import Executor, ExecutorError
from tandem.executor.mp_worker import Execute, Result, Shutdown, StartFailed, StepFailed
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.worker import WorkerSpec

START_TIMEOUT_S = 600.0


class MultiprocExecutor(Executor):
    name = "mp"
    SUPPORTS_ASYNC_SCHEDULING = True

    def __init__(self, spec: WorkerSpec, tracer: Tracer = NULL_TRACER) -> None:
        # A fresh interpreter (not fork: torch's thread pools do not survive it; not multiprocessing's
        # spawn: it re-imports the user's __main__), connected over a private Unix socket whose
        # address the OS picks, authenticated with a random key.
        self.tracer = tracer
        authkey = secrets.token_bytes(32)
        self._listener = Listener(family="AF_UNIX", authkey=authkey)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tandem.executor.mp_worker", str(self._listener.address)],
            stdin=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdin is not None
        self.process.stdin.write(authkey.hex() + "\n")
        self.process.stdin.close()
        self._pending: deque[Future[ModelRunnerOutput]] = deque()
        self._lock = threading.Lock()
        self._dead: str | None = None
        self._closing = False
        self._conn = self._accept(spec)
        self._reader = threading.Thread(target=self._read_loop, name="tandem-mp-reader", daemon=True)
        self._reader.start()

    @classmethod
    def create(
        cls, spec: WorkerSpec, *, checkpoint: object = None, tracer: Tracer = NULL_TRACER
    ) -> MultiprocExecutor:
        return cls(spec, tracer=tracer)  # the worker loads its own weights

    def _accept(self, spec: WorkerSpec) -> Connection:
        done: list[Connection] = []
        accepter = threading.Thread(target=lambda: done.append(self._listener.accept()), daemon=True)
        accepter.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while accepter.is_alive():
            accepter.join(0.2)
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                self._listener.close()
                raise ExecutorError(
                    f"worker process did not connect (exit code {self.process.poll()})"
                )
        self._listener.close()
        conn = done[0]
        conn.send(spec)
        while not conn.poll(0.2):
            if self.process.poll() is not None:
                raise ExecutorError(f"worker process exited at start-up ({self.process.returncode})")
        first = conn.recv()
        if isinstance(first, StartFailed):
            self.process.wait(5)
            raise ExecutorError(f"worker process failed to start: {first.error}")
        return conn

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
        try:
            self.process.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        reason = (
            "worker process shut down" if self._closing
            else f"worker process died (exit code {self.process.poll()})"
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
        if self._dead is not None or self.process.poll() is not None:
            raise ExecutorError(self._dead or f"worker process died ({self.process.poll()})")

    def shutdown(self) -> None:
        self._closing = True
        if self.process.poll() is None:
            try:
                self._conn.send(Shutdown())
            except (BrokenPipeError, OSError):
                pass
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        try:
            self._conn.close()
        except OSError:
            pass

