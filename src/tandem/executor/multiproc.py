"""``mp``: the runner lives in worker processes; typed messages over private Unix sockets.

One worker process per tensor-parallel rank (one without tensor parallelism), each on its own socket;
the ranks meet in a gloo / NCCL group through a FileStore in a private temporary directory. The engine
sends every ``Execute`` to every rank in step order and each rank's reader thread gets ``Result`` (rank
0) / ``RankAck`` (the others) / ``StepFailed`` back in the same order; the step's future resolves with
rank 0's result (``distributed/fanout.py``). If a worker dies (crash, kill, OOM), its reader sees the
pipe close, fails every pending future with ``ExecutorError`` naming the exit code (and the rank), and
the engine fails the affected requests and shuts down cleanly instead of hanging.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from multiprocessing.connection import Connection, Listener
from multiprocessing.reduction import ForkingPickler

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.distributed.fanout import RankAck, StepFanout
from tandem.distributed.process_group import DistInit, file_init_method, rank_device
from tandem.executor.base import Executor, ExecutorError
from tandem.executor.mp_worker import Abandon, Execute, Result, Shutdown, StartFailed, StepFailed
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.worker import WorkerSpec

START_TIMEOUT_S = 600.0


class MultiprocExecutor(Executor):
    name = "mp"
    SUPPORTS_ASYNC_SCHEDULING = True
    SUPPORTS_TENSOR_PARALLEL = True

    def __init__(self, spec: WorkerSpec, tracer: Tracer = NULL_TRACER) -> None:
        # Fresh interpreters (not fork: torch's thread pools do not survive it; not multiprocessing's
        # spawn: it re-imports the user's __main__), each connected over a private Unix socket whose
        # address the OS picks, authenticated with a random key.
        self.tracer = tracer
        self.world_size = spec.config.parallel.tensor_parallel_size
        self._closing = False
        self._store_dir = tempfile.mkdtemp(prefix="tandem-tp-") if self.world_size > 1 else None
        specs = self._rank_specs(spec)
        self.processes: list[subprocess.Popen[str]] = []
        listeners = []
        for _ in specs:
            authkey = secrets.token_bytes(32)
            listener = Listener(family="AF_UNIX", authkey=authkey)
            proc = subprocess.Popen(
                [sys.executable, "-m", "tandem.executor.mp_worker", str(listener.address)],
                stdin=subprocess.PIPE,
                text=True,
            )
            assert proc.stdin is not None
            proc.stdin.write(authkey.hex() + "\n")
            proc.stdin.close()
            listeners.append(listener)
            self.processes.append(proc)
        self._fanout = StepFanout(self.world_size, spec.config.observability.debug_invariants)
        self._steps: list[deque[int]] = [deque() for _ in specs]  # step ids each rank still owes
        self._lock = threading.Lock()
        try:
            self._conns = self._start(listeners, specs)
        except BaseException:
            self._kill_all()
            raise
        self._readers = [
            threading.Thread(
                target=self._read_loop, args=(rank,), name=f"tandem-mp-reader-{rank}", daemon=True
            )
            for rank in range(self.world_size)
        ]
        for reader in self._readers:
            reader.start()

    @property
    def process(self) -> subprocess.Popen[str]:
        """Rank 0's worker process (the only one without tensor parallelism)."""
        return self.processes[0]

    @property
    def lockstep_steps_checked(self) -> int:
        """Steps whose sampled tokens every rank reported identical (``debug_invariants``)."""
        return self._fanout.steps_checked

    def _rank_specs(self, spec: WorkerSpec) -> list[WorkerSpec]:
        if self.world_size == 1:
            return [spec]
        assert self._store_dir is not None
        device = spec.config.model.device
        dist = DistInit(self.world_size, file_init_method(self._store_dir), DistInit.backend_for(device))
        return [
            dataclasses.replace(
                spec, tp_rank=rank, dist=dist, device=rank_device(device, rank, False),
                trace=spec.trace and rank == 0,
            )
            for rank in range(self.world_size)
        ]

    def _label(self, rank: int) -> str:
        return "" if self.world_size == 1 else f" (rank {rank})"

    @classmethod
    def create(
        cls, spec: WorkerSpec, *, checkpoint: object = None, tracer: Tracer = NULL_TRACER
    ) -> MultiprocExecutor:
        return cls(spec, tracer=tracer)  # the worker loads its own weights

    def _start(self, listeners: list[Listener], specs: list[WorkerSpec]) -> list[Connection]:
        """Connect every rank, then send the specs: the ranks build (and rendezvous) concurrently."""
        deadline = time.monotonic() + START_TIMEOUT_S
        conns = [self._accept(rank, ls, deadline) for rank, ls in enumerate(listeners)]
        for conn, spec in zip(conns, specs):
            conn.send(spec)
        waiting = set(range(len(conns)))
        reported: dict[int, dict[str, object]] = {}
        while waiting:  # any rank may report first; a failing rank's own message names the cause
            for rank in sorted(waiting):
                if not conns[rank].poll(0.05):
                    continue
                first = conns[rank].recv()
                if isinstance(first, StartFailed):
                    raise ExecutorError(
                        f"worker process{self._label(rank)} failed to start: {first.error}"
                    )
                reported[rank] = first.execution
                waiting.discard(rank)
            for rank in sorted(waiting):
                proc = self.processes[rank]
                if proc.poll() is not None and not conns[rank].poll(0):
                    raise ExecutorError(
                        f"worker process{self._label(rank)} exited at start-up ({proc.returncode})"
                    )
            if waiting and time.monotonic() > deadline:
                raise ExecutorError(f"worker processes {sorted(waiting)} did not start in time")
        self.worker_execution = [reported[rank] for rank in range(len(conns))]
        return conns

    def _accept(self, rank: int, listener: Listener, deadline: float) -> Connection:
        done: list[Connection] = []
        accepter = threading.Thread(target=lambda: done.append(listener.accept()), daemon=True)
        accepter.start()
        proc = self.processes[rank]
        while accepter.is_alive():
            accepter.join(0.2)
            if proc.poll() is not None or time.monotonic() > deadline:
                listener.close()
                raise ExecutorError(
                    f"worker process{self._label(rank)} did not connect (exit code {proc.poll()})"
                )
        listener.close()
        return done[0]

    def _kill_all(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
        for proc in self.processes:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)

    def _read_loop(self, rank: int) -> None:
        conn, proc = self._conns[rank], self.processes[rank]
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                step_id = self._steps[rank].popleft() if self._steps[rank] else None
            if step_id is None:
                continue
            if isinstance(msg, Result):
                self.tracer.extend(msg.spans)
                self._fanout.output(step_id, msg.output)
            elif isinstance(msg, RankAck):
                self._fanout.ack(step_id, msg)
            elif isinstance(msg, StepFailed):
                died = self._died()
                if died is not None:  # a peer's death broke this rank's collective: name the cause
                    self._fanout.fail(died)
                else:
                    self._fanout.step_failed(step_id, rank, msg.error)
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        if self._closing:
            reason = "worker process shut down"
        elif self.world_size == 1:
            reason = f"worker process died (exit code {proc.poll()})"
        else:
            reason = f"worker process died (rank {rank}, exit code {proc.poll()})"
        self._fanout.fail(reason)

    def _died(self) -> str | None:
        if self.world_size == 1 or self._closing:
            return None
        for rank, proc in enumerate(self.processes):
            if proc.poll() is not None:
                return f"worker process died (rank {rank}, exit code {proc.returncode})"
        return None

    def execute_model(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        step_id = scheduler_output.step_id
        fut = self._fanout.launch(step_id)
        if fut.done():  # the executor is dead
            return fut
        payload = ForkingPickler.dumps(Execute(scheduler_output))  # pickled once for every rank
        with self._lock:
            for steps in self._steps:
                steps.append(step_id)
        try:
            for conn in self._conns:
                conn.send_bytes(payload)
        except (BrokenPipeError, OSError) as exc:
            reason = f"worker process unreachable: {exc!r}"
            if self.world_size > 1:  # some ranks may have the step: they are out of lockstep now
                self._fanout.fail(reason)
                return fut
            with self._lock:
                if step_id in self._steps[0]:
                    self._steps[0].remove(step_id)
            lost = self._fanout.forget(step_id)
            if lost is not None:
                lost.set_exception(ExecutorError(reason))
        return fut

    def check_health(self) -> None:
        if self._fanout.dead is not None:
            raise ExecutorError(self._fanout.dead)
        for rank, proc in enumerate(self.processes):
            if proc.poll() is not None:
                raise ExecutorError(f"worker process{self._label(rank)} died ({proc.poll()})")

    def abandon(self, req_ids: list[str]) -> None:
        if self.world_size > 1:  # the ranks could skip differently and leave lockstep
            return
        try:
            self._conns[0].send(Abandon(list(req_ids)))
        except (BrokenPipeError, OSError):
            pass  # a dead worker is reported by the step it fails

    def shutdown(self) -> None:
        failed = self._fanout.dead is not None
        self._closing = True
        for conn, proc in zip(self._conns, self.processes):
            if proc.poll() is None:
                try:
                    conn.send(Shutdown())
                except (BrokenPipeError, OSError):
                    pass
        # After a failure a surviving rank may be blocked in a collective with a dead peer: no waiting.
        deadline = time.monotonic() + (1.0 if failed and self.world_size > 1 else 10.0)
        for proc in self.processes:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)

