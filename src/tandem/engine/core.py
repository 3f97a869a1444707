"""The engine core: scheduler + executor, stepped synchronously or with a batch queue of depth 2.

Both loops are built from the same three pieces (docs/SEMANTICS.md §4):

    schedule()            -> SchedulerOutput          (host)
    executor.execute(so)  -> Future[ModelRunnerOutput] (device / worker)
    update(so, output)    -> list[EngineCoreOutput]    (host)

- ``step_sync``: schedule(N) -> execute(N) -> wait -> update(N).
- ``step_async``: schedule and launch N+1 *before* waiting for N, then wait for N and update. While the
  worker executes N, the host schedules and prepares N+1: that is the overlap.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from tandem.core.interface import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from tandem.core.request import Request, RequestStatus
from tandem.core.scheduler import Scheduler
from tandem.executor.base import Executor, ExecutorError
from tandem.engine.stats_logger import StatsLogger
from tandem.trace.tracer import NULL_TRACER, Tracer

logger = logging.getLogger("tandem.engine")

QUEUE_DEPTH = 2
WAIT_POLL_S = 0.02  # how often a wait for a step runs ``while_waiting`` (when set)


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        *,
        async_scheduling: bool,
        debug_invariants: bool = False,
        tracer: Tracer = NULL_TRACER,
    ) -> None:
        if async_scheduling and not scheduler.is_async:
            raise ValueError("async scheduling needs an AsyncScheduler")
        self.scheduler = scheduler
        self.executor = executor
        self.async_scheduling = async_scheduling
        self.debug_invariants = debug_invariants
        self.tracer = tracer
        # Called every WAIT_POLL_S while the loop waits for a step (AsyncLLM: apply aborts that arrived, so
        # a step still queued in the worker for an abandoned request is skipped, not computed).
        self.while_waiting: Callable[[], None] | None = None
        self.stats_logger: StatsLogger | None = None  # disable_log_stats off: a line every few seconds
        self._queue: deque[tuple[SchedulerOutput, Future[ModelRunnerOutput]]] = deque()
        self.failed: BaseException | None = None

    # -- requests ----------------------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def abort_requests(self, req_ids: list[str]) -> list[str]:
        done = self.scheduler.abort_requests(req_ids)
        if done and self._queue:  # steps holding them may still wait in the worker: it may skip those
            self.executor.abandon(done)
        return done

    def finish_requests(self, req_ids: list[str], status: RequestStatus) -> list[str]:
        return self.scheduler.finish_requests(req_ids, status)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._queue)

    # -- stepping ----------------------------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        if self.failed is not None:
            raise ExecutorError(f"engine failed earlier: {self.failed}") from self.failed
        try:
            outputs = self.step_async() if self.async_scheduling else self.step_sync()
        except ExecutorError as exc:
            self.failed = exc
            return self._fail_all(str(exc))
        if self.debug_invariants:
            self.scheduler.check_invariants()
            if not self._queue:
                self.check_idle_invariants()
        if self.stats_logger is not None:
            self.stats_logger.maybe_log(self.scheduler)
        return outputs

    def _schedule(self) -> SchedulerOutput:
        with self.tracer.span("schedule", track="engine") as span:
            so = self.scheduler.schedule()
            span.args.update(step=so.step_id, reqs=len(so.num_scheduled_tokens), tokens=so.total_num_scheduled_tokens)
            if so.num_drafts_to_propose is not None:  # the speculation policy's choice for this step
                span.args.update(drafts=sum(map(len, so.scheduled_spec_decode_tokens.values())),
                                 propose_k=so.num_drafts_to_propose)
        if self.debug_invariants:
            self.scheduler.check_invariants()  # also right after scheduling, with steps in flight
        return so

    def _update(self, so: SchedulerOutput, out: ModelRunnerOutput) -> list[EngineCoreOutput]:
        with self.tracer.span("update", track="engine", step=so.step_id) as span:
            results = self.scheduler.update_from_output(so, out)
            if not self.tracer.enabled:
                return results
            # Proposed / accepted per step as the scheduler committed them (the trace analysis reads these).
            span.args["drafts"] = sum(o.num_draft_tokens for o in results)
            span.args["accepted"] = sum(o.num_accepted_tokens for o in results)
            span.args["verifies"] = sum(1 for o in results if o.num_draft_tokens)
            return results

    def _wait(self, so: SchedulerOutput, fut: Future[ModelRunnerOutput]) -> ModelRunnerOutput:
        with self.tracer.span("wait_output", track="wait", step=so.step_id):
            try:
                while self.while_waiting is not None:
                    try:
                        out = fut.result(timeout=WAIT_POLL_S)
                        break
                    except TimeoutError:
                        self.while_waiting()
                else:
                    out = fut.result()
                return out
            except ExecutorError:
                raise
            except Exception as exc:  # the worker raised: surface it as an executor failure
                raise ExecutorError(f"step {so.step_id} failed in the worker: {exc!r}") from exc

    def step_sync(self) -> list[EngineCoreOutput]:
        so = self._schedule()
        if not so.num_scheduled_tokens:
            return []
        fut = self.executor.execute_model(so)
        return self._update(so, self._wait(so, fut))

    def step_async(self) -> list[EngineCoreOutput]:
        if self.scheduler.requests and len(self._queue) < QUEUE_DEPTH:  # (unfinished requests)
            so = self._schedule()
            if so.num_scheduled_tokens:
                self._queue.append((so, self.executor.execute_model(so)))
                if len(self._queue) < QUEUE_DEPTH:
                    return []  # keep the worker fed before waiting on anything
        if not self._queue:
            return []
        so, fut = self._queue.popleft()
        return self._update(so, self._wait(so, fut))

    def drain(self) -> list[EngineCoreOutput]:
        """Wait for every step in flight and apply its output (used before shutdown)."""
        outputs: list[EngineCoreOutput] = []
        while self._queue:
            so, fut = self._queue.popleft()
            outputs.extend(self._update(so, self._wait(so, fut)))
        return outputs

    def _fail_all(self, message: str) -> list[EngineCoreOutput]:
        """The executor died: every live request fails with the error; nothing stays allocated."""
        self._queue.clear()
        live = list(self.scheduler.requests)
        self.scheduler.finish_requests(live, RequestStatus.FINISHED_ERROR)
        return [EngineCoreOutput(rid, [], finish_reason="error", error=message) for rid in live]

    # -- invariants --------------------------------------------------------------------------------------
    def check_idle_invariants(self) -> None:
        """Nothing in flight: every placeholder is back to zero."""
        for req in self.scheduler.requests.values():
            if req.num_output_placeholders or req.inflight:
                raise AssertionError(f"{req.request_id}: placeholders left with nothing in flight")

    def shutdown(self) -> None:
        self._queue.clear()
        self.executor.shutdown()
