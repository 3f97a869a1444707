"""``ray``: one Ray actor per tensor-parallel rank, placed by a placement group (one bundle per rank).

Cluster: ``ray_address`` (else ``$RAY_ADDRESS``) connects to a cluster the user already runs, possibly
multi-node (tandem and the model must then be available on every node); without one, a local cluster
is started on 127.0.0.1 with no dashboard and stopped again at shutdown. A Ray session the caller
already initialized is used as it is and left running.

The actors run the same worker code as ``mp`` (``build_runner``). When every actor runs on the
caller's node (always so on the local cluster) the ranks meet through a FileStore in a private
temporary directory and gloo's sockets stay on the loopback interface, as with ``mp``; across nodes,
over TCP at rank 0's node address, on a port rank 0's host reports free at start-up. Every process
of the local cluster listens on loopback only (``SINGLE_MACHINE_SWITCH`` below).

Each step is put into the object store once and ``execute_model.remote`` is called on every actor; Ray
runs one caller's tasks on an actor in submission order, so every rank sees the same steps in the
same order. Rank 0's reply resolves the step's future, the others acknowledge
(``distributed/fanout.py``). An actor that dies fails its pending tasks with a Ray actor error: every
pending future fails with ``ExecutorError`` and the engine fails the affected requests; shutdown kills
the actors without waiting on them.

Async scheduling works as with ``mp``: ``.remote`` returns at once, so the engine schedules step N+1
while the actors run step N. One difference: with ``deferred_reconciliation`` the actor copies its
output to the host before returning (Ray serializes the return value on the actor's thread), so that
copy is not moved off the worker's critical path as the ``mp`` sender thread moves it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from typing import Any

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.distributed.fanout import RankAck, StepFanout, rank_reply
from tandem.distributed.process_group import (
    DistInit,
    file_init_method,
    free_tcp_port,
    rank_device,
)
from tandem.executor.base import Executor, ExecutorError
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.worker import WorkerSpec

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0
DEATH_GRACE_S = 2.0
LOCAL_OBJECT_STORE_BYTES = 128 << 20  # steps and outputs are small; Ray's default takes 30 % of RAM


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "executor_backend 'ray' needs Ray: pip install 'tandem-llm[ray]'"
        ) from exc
    return ray


# On Linux Ray replaces a loopback node address by the machine's routable one and binds its servers
# to every interface, unless this switch (meant for single-machine use on macOS / Windows) is off:
# then the node is 127.0.0.1 and every Ray process listens on loopback only. Ray reads it once, when
# it is imported, so it must be set before that.
SINGLE_MACHINE_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def prefer_loopback() -> None:
    """Before Ray's first import in this process: make a local cluster's node loopback-only (the
    user's own setting of the switch wins; an already imported Ray is left as it is)."""
    if "ray" not in sys.modules:
        os.environ.setdefault(SINGLE_MACHINE_SWITCH, "0")


def init_local_cluster(num_cpus: int) -> None:
    """A single-node Ray cluster for this process, on the loopback address, without dashboard or
    usage reporting. If Ray was imported before tandem could set the switch above, the node takes
    the machine's address (logged)."""
    prefer_loopback()
    ray = import_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        log_to_driver=False,
    )
    node_ip = ray.util.get_node_ip_address()
    if node_ip != "127.0.0.1":
        logger.warning(
            "local Ray cluster on %s, not loopback: Ray was imported before tandem started it "
            "(set %s=0 before importing ray for a loopback-only cluster)",
            node_ip, SINGLE_MACHINE_SWITCH,
        )


class RankActor:
    """One rank's worker, living in a Ray worker process (wrapped by ``ray.remote`` at start-up)."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.rank = 0
        self.check_lockstep = False

    def node_id(self) -> str:
        return str(import_ray().get_runtime_context().get_node_id())

    def node_ip(self) -> str:
        return str(import_ray().util.get_node_ip_address())

    def free_port(self, host: str) -> int:
        return free_tcp_port(host)

    def pid(self) -> int:
        return os.getpid()

    def start(self, spec: WorkerSpec, threads: int) -> tuple[int, dict[str, object]]:
        """Build the runner; (this process's pid, what it built: tandem.execution.built_execution)."""
        import torch

        from tandem.execution import built_execution
        from tandem.worker.worker import build_runner

        torch.set_num_threads(threads)
        if spec.execution is not None:  # the engine's choice, whatever this actor's environment says
            spec.execution.apply_process_wide()
        self.rank = spec.tp_rank
        self.check_lockstep = spec.config.observability.debug_invariants
        self.runner = build_runner(spec)
        return os.getpid(), built_execution(self.runner.model)

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput | RankAck:
        return rank_reply(self.runner.execute_model(so), self.rank, self.check_lockstep)


class RayExecutor(Executor):
    name = "ray"
    SUPPORTS_ASYNC_SCHEDULING = True
    SUPPORTS_TENSOR_PARALLEL = True

    def __init__(self, spec: WorkerSpec, tracer: Tracer = NULL_TRACER) -> None:
        par = spec.config.parallel
        address = par.ray_address or os.environ.get("RAY_ADDRESS")
        if not address:
            prefer_loopback()  # a local cluster may be started below
        ray = import_ray()
        self._ray = ray
        self.tracer = tracer  # spans are not collected from Ray actors
        self.world_size = par.tensor_parallel_size
        self._closing = False
        self._owns_cluster = False
        self.actors: list[Any] = []
        self._pg: Any = None
        self._store_dir: str | None = None  # the local cluster's FileStore rendezvous
        self._fanout = StepFanout(self.world_size, spec.config.observability.debug_invariants)
        self.threads = par.worker_threads or 1  # torch threads per rank = CPUs per bundle
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                self._init_local(ray)
        try:
            self._start(spec)
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def create(
        cls, spec: WorkerSpec, *, checkpoint: object = None, tracer: Tracer = NULL_TRACER
    ) -> RayExecutor:
        return cls(spec, tracer=tracer)  # every actor loads its own weights

    def _init_local(self, ray: Any) -> None:
        init_local_cluster(max(os.cpu_count() or 1, self.world_size * self.threads))
        self._owns_cluster = True

    def _start(self, spec: WorkerSpec) -> None:
        ray = self._ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        device = spec.config.model.device
        cuda = device.startswith("cuda")
        bundle = {"CPU": float(self.threads), **({"GPU": 1.0} if cuda else {})}
        self._pg = placement_group([bundle] * self.world_size, strategy="PACK")
        try:
            ray.get(self._pg.ready(), timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as exc:
            raise ExecutorError(
                f"the Ray cluster cannot place {self.world_size} bundles of {bundle}"
            ) from exc
        actor_cls = ray.remote(RankActor)
        self.actors = [
            actor_cls.options(
                num_cpus=self.threads,
                num_gpus=1 if cuda else 0,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=rank
                ),
            ).remote()
            for rank in range(self.world_size)
        ]
        dist = None
        here = ray.get_runtime_context().get_node_id()
        nodes = ray.get([a.node_id.remote() for a in self.actors], timeout=START_TIMEOUT_S)
        if self.world_size > 1 and set(nodes) == {here}:  # every rank runs on this machine
            self._store_dir = tempfile.mkdtemp(prefix="tandem-tp-")
            init_method = file_init_method(self._store_dir)
            dist = DistInit(self.world_size, init_method, DistInit.backend_for(device))
        elif self.world_size > 1:
            host = ray.get(self.actors[0].node_ip.remote(), timeout=START_TIMEOUT_S)
            port = ray.get(self.actors[0].free_port.remote(host), timeout=START_TIMEOUT_S)
            dist = DistInit(
                self.world_size, f"tcp://{host}:{port}", DistInit.backend_for(device), loopback=False
            )
        specs = [
            dataclasses.replace(
                spec, tp_rank=rank, dist=dist, device=rank_device(device, rank, True), trace=False
            )
            for rank in range(self.world_size)
        ]
        refs = [a.start.remote(s, self.threads) for a, s in zip(self.actors, specs)]
        try:
            started = ray.get(refs, timeout=START_TIMEOUT_S)
        except Exception as exc:
            raise ExecutorError(f"ray workers failed to start: {exc}") from exc
        self.pids = [pid for pid, _ in started]
        self.worker_execution = [execution for _, execution in started]

    # -- steps -------------------------------------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        step_id = scheduler_output.step_id
        fut = self._fanout.launch(step_id)
        if fut.done():  # the executor is dead
            return fut
        so_ref = self._ray.put(scheduler_output)  # one copy in the object store for every rank
        for rank, actor in enumerate(self.actors):
            ref = actor.execute_model.remote(so_ref)
            ref.future().add_done_callback(functools.partial(self._on_reply, step_id, rank))
        return fut

    def _on_reply(self, step_id: int, rank: int, done: Future[Any]) -> None:
        errors = self._ray.exceptions
        try:
            reply = done.result()
        except errors.RayTaskError as exc:  # the step raised inside the actor
            self._task_failed(step_id, rank, str(exc))
            return
        except Exception as exc:  # the actor died or became unreachable
            reason = "ray workers shut down" if self._closing else f"ray worker died (rank {rank})"
            self._fanout.fail(f"{reason}: {type(exc).__name__}")
            return
        if isinstance(reply, RankAck):
            self._fanout.ack(step_id, reply)
        else:
            self._fanout.output(step_id, reply)

    def _task_failed(self, step_id: int, rank: int, error: str) -> None:
        if self.world_size == 1:
            self._fanout.step_failed(step_id, rank, error)
            return

        # A peer's death usually surfaces first as a broken collective on a surviving rank; give
        # Ray a moment to report the death itself, so the error names the cause.
        def report() -> None:
            deadline = time.monotonic() + DEATH_GRACE_S
            while self._fanout.dead is None and time.monotonic() < deadline:
                time.sleep(0.05)
            self._fanout.step_failed(step_id, rank, error)  # no effect if already failed

        threading.Thread(target=report, name="tandem-ray-failure", daemon=True).start()

    @property
    def lockstep_steps_checked(self) -> int:
        return self._fanout.steps_checked

    def check_health(self) -> None:
        if self._fanout.dead is not None:
            raise ExecutorError(self._fanout.dead)

    def shutdown(self) -> None:
        self._closing = True
        ray = self._ray
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - the cluster may be gone
                pass
            self._pg = None
        self._fanout.fail("ray workers shut down")
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)
            self._store_dir = None
        if self._owns_cluster and ray.is_initialized():
            ray.shutdown()
            self._owns_cluster = False
