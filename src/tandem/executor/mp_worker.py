"""The ``mp`` worker process: typed messages and the serve loop.

Started by :class:`~tandem.executor.multiproc.MultiprocExecutor` as
``python -m tandem.executor.mp_worker ADDRESS`` with the connection's auth key on stdin.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.distributed.fanout import rank_reply
from tandem.trace.tracer import NULL_TRACER, Span, Tracer
from tandem.worker.pending import PendingStep
from tandem.worker.worker import WorkerSpec


# -- messages ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Execute:
    scheduler_output: SchedulerOutput


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Abandon:
    """Requests the engine aborted: applied by the receiver thread at once, ahead of queued steps."""

    req_ids: list[str]


@dataclass(frozen=True)
class Ready:
    pid: int
    execution: dict[str, object]  # what this worker built (tandem.execution.built_execution)


@dataclass(frozen=True)
class StartFailed:
    error: str


@dataclass(frozen=True)
class Result:
    output: ModelRunnerOutput | PendingStep  # the runner's PendingStep until the sender materializes it
    spans: list[Span] = field(default_factory=list)


@dataclass(frozen=True)
class StepFailed:
    error: str


def _serve(spec: WorkerSpec, conn: Connection) -> None:
    """The worker process's loop: build the runner, then execute steps until told to stop."""
    import torch

    from tandem.execution import built_execution
    from tandem.worker.worker import build_runner

    if spec.execution is not None:  # the engine's choice, whatever this process's environment says
        spec.execution.apply_process_wide()
    parallel = spec.config.parallel
    torch.set_num_threads(worker_threads(parallel.worker_threads, parallel.tensor_parallel_size))
    check_lockstep = spec.config.observability.debug_invariants
    tracer = Tracer("tandem-worker") if spec.trace else NULL_TRACER
    try:
        runner = build_runner(spec, tracer=tracer)
    except BaseException as exc:  # report, then exit
        conn.send(StartFailed(f"{exc!r}\n{traceback.format_exc()}"))
        return
    conn.send(Ready(os.getpid(), built_execution(runner.model)))
    # A receiver thread unpickles the next step's message while the current step computes, so a
    # queued step starts the moment the previous one ends (no device idle gap for message handling).
    inbox: queue.Queue[object] = queue.Queue()

    def receive() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                inbox.put(Shutdown())  # the engine went away
                return
            if isinstance(msg, Abandon):
                runner.abandon(msg.req_ids)
                continue
            inbox.put(msg)
            if isinstance(msg, Shutdown):
                return

    # A sender thread pickles and sends each result while the next queued step already computes.
    outbox: queue.Queue[object] = queue.Queue()

    def send() -> None:
        while True:
            item = outbox.get()
            if item is None:
                return
            if isinstance(item, Result) and spec.tp_rank > 0:
                # Tensor parallelism: rank 0 reports the step, the others acknowledge it.
                item = rank_reply(item.output, spec.tp_rank, check_lockstep)
            elif isinstance(item, Result):
                item = Result(item.output.materialize(), item.spans)  # host copy off the main loop
            try:
                conn.send(item)
            except (BrokenPipeError, OSError):
                return

    threading.Thread(target=receive, name="tandem-worker-recv", daemon=True).start()
    sender = threading.Thread(target=send, name="tandem-worker-send", daemon=True)
    sender.start()
    try:
        while True:
            msg = inbox.get()
            if isinstance(msg, Shutdown):
                return
            if isinstance(msg, Execute):
                try:
                    out = runner.execute_model(msg.scheduler_output)
                except Exception as exc:
                    outbox.put(StepFailed(f"{exc!r}\n{traceback.format_exc()}"))
                    continue
                outbox.put(Result(out, tracer.take() if spec.trace else []))
    finally:
        outbox.put(None)
        sender.join(5)


def worker_threads(requested: int | None, num_ranks: int = 1) -> int:
    """Torch threads in the worker process: as asked, else all cores but one, which is left to the
    engine process (its host work would otherwise preempt a torch thread and stall the others),
    shared evenly by the tensor-parallel ranks (2 ranks on 2 cores: one thread each)."""
    if requested:
        return requested
    return max(1, ((os.cpu_count() or 2) - 1) // num_ranks)


def main() -> None:
    address = sys.argv[1]
    authkey = bytes.fromhex(sys.stdin.readline().strip())
    conn = Client(address, family="AF_UNIX", authkey=authkey)
    spec = conn.recv()
    _serve(spec, conn)


if __name__ == "__main__":
    # Re-import under the package name so the message classes pickle as tandem.executor.mp_worker.*,
    # not as __main__.* (which the engine could not resolve).
    from tandem.executor import mp_worker

    mp_worker.main()
