"""The engine behind the server: an ``Engine`` stepped on its own thread, fed from an asyncio loop.

Threads and who touches what:
- the caller's event loop validates and tokenizes (``RequestFactory``), then queues commands (add,
  abort) and wakes the engine thread; it never touches the scheduler;
- the engine thread owns the ``EngineCore`` and the ``OutputProcessor``: it applies queued commands,
  runs ``core.step()`` while any work exists and sleeps on a condition otherwise; after each step it
  hands each request's new text / tokens to that request's ``asyncio.Queue`` with
  ``loop.call_soon_threadsafe`` and takes a metrics snapshot (so ``/metrics`` never reads the
  scheduler while it changes).

A request whose consumer goes away (client disconnect: the generator is closed or cancelled) is
aborted at once: its blocks are freed at the next command drain, i.e. within one engine step. A
worker failure (``EngineCore.failed``) finishes every live request with ``finish_reason="error"``
and marks the engine dead; later requests are refused with ``EngineDeadError``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.async_decision import AsyncSchedulingDecision
from tandem.core.request import RequestStatus
from tandem.engine.builder import Engine, build_engine
from tandem.engine.llm import EngineDeadError, config_from_kwargs
from tandem.engine.metrics import Metric, collect_metrics
from tandem.engine.output_processor import FrontRequest, OutputProcessor
from tandem.engine.prompts import Prompt
from tandem.engine.requests import MadeRequest, RequestFactory
from tandem.executor.base import ExecutorError
from tandem.native.omp import release_idle_team
from tandem.outputs import PromptLogprobs, SampleLogprobs
from tandem.sampling_params import RequestOutputKind, SamplingParams
from tandem.trace.tracer import NULL_TRACER, Tracer

logger = logging.getLogger("tandem.engine")

FinishListener = Callable[[FrontRequest], None]


@dataclass(frozen=True)
class RequestDelta:
    """What changed for one sample (choice) since the last delta; safe to hand across threads."""

    request_id: str
    index: int  # the choice index within the ``generate`` call
    text: str
    token_ids: list[int]
    logprobs: SampleLogprobs | None  # one entry per token in ``token_ids``
    finish_reason: str | None
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_output_tokens: int  # cumulative
    num_cached_tokens: int = 0
    error: str | None = None
    # Every prompt position's logprobs (the first None), once: in the first delta after the prefill.
    prompt_logprobs: PromptLogprobs | None = None
    pooled: list[float] | None = None  # pooling runner: the prompt's embedding, in the final delta


class _Stream:
    """The consumer side of one ``add_request``: its loop, its queue, child id -> choice index."""

    def __init__(self, loop: asyncio.AbstractEventLoop, index: dict[str, int]) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[list[RequestDelta] | BaseException] = asyncio.Queue()
        self.index = index

    def put(self, item: list[RequestDelta] | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening
            pass


class RequestStream:
    """One ``add_request`` call's results. ``close`` (idempotent) aborts every unfinished sample;
    it runs whenever ``deltas`` stops early, and the server calls it again on every exit path."""

    def __init__(self, engine: AsyncLLM, stream: _Stream) -> None:
        self._engine = engine
        self._stream = stream
        self.live = set(stream.index)

    async def deltas(self) -> AsyncIterator[RequestDelta]:
        try:
            while self.live:
                item = await self._stream.queue.get()
                if isinstance(item, BaseException):
                    self.live.clear()  # the engine already dropped these requests
                    raise item
                for delta in item:
                    if delta.finish_reason is not None:
                        self.live.discard(delta.request_id)
                    yield delta
        finally:
            self.close()

    def interrupt(self, exc: BaseException) -> None:
        """End ``deltas`` with ``exc`` (the server's shutdown); the samples are then aborted by ``close``."""
        if self.live:
            self._stream.put(exc)

    def close(self) -> None:
        if not self.live:
            return
        ids, self.live = sorted(self.live), set()
        try:
            self._engine.abort(ids)
        except EngineDeadError:
            pass  # shutting down: nothing left to free


class AsyncLLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        self.config = config_from_kwargs(model, **kwargs)
        tracer: Tracer = Tracer() if self.config.observability.trace_file else NULL_TRACER
        self.engine: Engine = build_engine(self.config, tracer)
        self.tokenizer = self.engine.tokenizer
        self.factory = RequestFactory(self.engine, self.config.model.seed)
        self._out = OutputProcessor(self.tokenizer)
        self._streams: dict[str, _Stream] = {}  # child request id -> its consumer (engine thread)
        self._cond = threading.Condition()
        self.engine.core.while_waiting = self._aborts_while_waiting
        self._adds: list[tuple[list[MadeRequest], _Stream, float]] = []
        self._aborts: list[str] = []
        self._stopping = False
        self.dead: str | None = None
        self.finish_listeners: list[FinishListener] = []
        self._snapshot: list[Metric] = collect_metrics(self.engine)
        self._thread = threading.Thread(target=self._run, name="tandem-engine", daemon=True)
        self._thread.start()

    # -- read-back ---------------------------------------------------------------------------------
    @property
    def async_scheduling(self) -> AsyncSchedulingDecision:
        return self.engine.plan.decision

    @property
    def max_model_len(self) -> int:
        return self.engine.plan.max_model_len

    @property
    def healthy(self) -> bool:
        return self.dead is None and self._thread.is_alive()

    def metrics(self) -> list[Metric]:
        """The engine's numbers as of the end of the last engine-loop iteration."""
        return self._snapshot

    # -- requests ----------------------------------------------------------------------------------
    def add_request(
        self,
        prompts: Sequence[Prompt],
        params: Sequence[SamplingParams],
        request_id: str,
    ) -> RequestStream:
        """Validate (``ValueError`` before anything is queued) and queue every sample of every
        prompt (choice index = prompt * n + sample). Call it from the loop that reads the stream."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine failed: {self.dead}")
        parents = (
            [request_id]
            if len(prompts) == 1
            else [f"{request_id}-p{j}" for j in range(len(prompts))]
        )
        made = self.factory.make(prompts, params, parents)
        stream = _Stream(
            asyncio.get_running_loop(), {m.request.request_id: i for i, m in enumerate(made)}
        )
        self._submit(adds=[(made, stream, time.monotonic())])
        return RequestStream(self, stream)

    async def generate(
        self,
        prompts: Sequence[Prompt],
        params: Sequence[SamplingParams],
        request_id: str,
    ) -> AsyncIterator[RequestDelta]:
        """``add_request`` and iterate its outputs until every sample finished, as the params'
        ``output_kind`` (vLLM's) says: ``CUMULATIVE`` (the default) each choice's text, tokens and logprobs so
        far; ``DELTA`` only what is new; ``FINAL_ONLY`` one output per choice, when it finishes."""
        kinds = {sp.output_kind for sp in params}
        if len(kinds) > 1:
            raise ValueError("output_kind must be the same for every prompt of one generate call")
        kind = kinds.pop() if kinds else RequestOutputKind.CUMULATIVE
        so_far: dict[int, RequestDelta] = {}
        async for delta in self.add_request(prompts, params, request_id).deltas():
            if kind == RequestOutputKind.DELTA:
                yield delta
                continue
            prev = so_far.get(delta.index)
            if prev is not None:
                logprobs = None if delta.logprobs is None else [*(prev.logprobs or []), *delta.logprobs]
                delta = dataclasses.replace(delta, text=prev.text + delta.text,
                                            token_ids=[*prev.token_ids, *delta.token_ids], logprobs=logprobs,
                                            prompt_logprobs=delta.prompt_logprobs or prev.prompt_logprobs)
            so_far[delta.index] = delta
            if kind == RequestOutputKind.CUMULATIVE or delta.finish_reason is not None:
                yield delta

    def abort(self, request_ids: Sequence[str]) -> None:
        """Thread-safe; applied by the engine thread at once, even while it waits for a step (a step queued
        in the worker that computes only aborted requests is then skipped: ``ModelRunner.abandon``)."""
        self._submit(aborts=list(request_ids))

    def _submit(
        self,
        adds: list[tuple[list[MadeRequest], _Stream, float]] | None = None,
        aborts: list[str] | None = None,
    ) -> None:
        with self._cond:
            if self._stopping or (adds and self.dead is not None):
                raise EngineDeadError(f"the engine is not running: {self.dead or 'shutting down'}")
            self._adds.extend(adds or ())
            self._aborts.extend(aborts or ())
            self._cond.notify()

    # -- the engine thread -------------------------------------------------------------------------
    def _run(self) -> None:
        core = self.engine.core
        try:
            while True:
                with self._cond:
                    while not (self._adds or self._aborts or self._stopping or self._busy()):
                        self._cond.wait()
                    if self._stopping:
                        return
                    adds, self._adds = self._adds, []
                    aborts, self._aborts = self._aborts, []
                for made, stream, arrival in adds:
                    self._add(made, stream, arrival)
                if aborts:
                    self._abort(aborts)
                if core.has_unfinished_requests() and self.dead is None:
                    release_idle_team()  # an idle OpenMP team here would slow the worker's (native/omp.py)
                    self._step()
                self._snapshot = collect_metrics(self.engine)
        except BaseException as exc:  # a bug in tandem: fail everyone rather than hang them
            logger.exception("engine loop crashed")
            self._die(f"engine loop crashed: {exc!r}")

    def _busy(self) -> bool:
        return self.dead is None and self.engine.core.has_unfinished_requests()

    def _add(self, made: list[MadeRequest], stream: _Stream, arrival: float) -> None:
        if self.dead is not None:
            stream.put(EngineDeadError(f"the engine failed: {self.dead}"))
            return
        core = self.engine.core
        added: list[str] = []
        try:
            for req, prompt, index, _ in made:
                req.arrival_time = arrival
                self._out.add_request(
                    req.request_id,
                    prompt.text,
                    req.prompt_token_ids,
                    req.sampling_params,
                    arrival,
                    index,
                )
                self._streams[req.request_id] = stream
                core.add_request(req)
                added.append(req.request_id)
        except ValueError as exc:  # the scheduler refused it: undo, tell the consumer
            core.abort_requests(added)
            for req, *_ in made:
                self._out.pop(req.request_id)
                self._streams.pop(req.request_id, None)
            stream.put(exc)

    def _aborts_while_waiting(self) -> None:
        """Aborts that arrived while the loop waits for a step, applied at once (``EngineCore.while_waiting``):
        a queued step that only computes abandoned requests (a long prefill chunk) is then skipped."""
        with self._cond:
            aborts, self._aborts = self._aborts, []
        if aborts:
            self._abort(aborts)
            self._snapshot = collect_metrics(self.engine)

    def _abort(self, req_ids: list[str]) -> None:
        self.engine.core.abort_requests(req_ids)
        now = time.monotonic()
        for rid in req_ids:
            fr = self._out.pop(rid)
            self._streams.pop(rid, None)
            if fr is not None and not fr.finished:  # its consumer went away: finished as "abort"
                fr.finish_reason = "abort"
                fr.metrics.finished_time = now
                self._notify_finished(fr)

    def _notify_finished(self, fr: FrontRequest) -> None:
        for listener in self.finish_listeners:
            try:
                listener(fr)
            except Exception:  # a metrics bug must not stop the engine
                logger.exception("finish listener failed")

    def _step(self) -> None:
        core = self.engine.core
        try:
            outs = core.step()
        except ExecutorError as exc:
            self._die(str(exc))
            return
        changed, stopped = self._out.process(outs)
        if stopped:
            core.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        self._deliver(changed)
        if core.failed is not None:
            self._die(str(core.failed))

    def _deliver(self, changed: list[FrontRequest]) -> None:
        batches: dict[int, tuple[_Stream, list[RequestDelta]]] = {}
        for fr in changed:
            stream = self._streams.get(fr.req_id)
            if stream is None:
                continue
            delta = _delta(fr, stream.index[fr.req_id])
            if not (delta.text or delta.token_ids or delta.finish_reason):
                continue
            batches.setdefault(id(stream), (stream, []))[1].append(delta)
            if fr.finished:
                self._out.pop(fr.req_id)
                del self._streams[fr.req_id]
                self._notify_finished(fr)
        for stream, deltas in batches.values():
            stream.put(deltas)

    def _die(self, message: str, shutting_down: bool = False) -> None:
        """Fail every request still waiting for output; refuse new ones."""
        with self._cond:
            self.dead = message
        if shutting_down:
            logger.info("engine shut down with %d request(s) open", len(self._streams))
        else:
            logger.error("engine is dead: %s", message)
        for stream in {id(s): s for s in self._streams.values()}.values():
            stream.put(EngineDeadError(f"the engine failed: {message}"))
        self._streams.clear()
        self._out.requests.clear()

    # -- lifecycle ---------------------------------------------------------------------------------
    def shutdown(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._streams:
            self._die("the engine was shut down", shutting_down=True)
        self.engine.core.shutdown()
        path = self.config.observability.trace_file
        if path and self.engine.tracer.enabled:
            self.engine.tracer.save(path)  # the whole serving session, for Perfetto / trace analyze


def _delta(fr: FrontRequest, index: int) -> RequestDelta:
    start = fr.streamed_tokens
    text, token_ids = fr.take_delta()
    logprobs = None if fr.logprobs is None else fr.logprobs[start : start + len(token_ids)]
    prompt_logprobs = None
    if fr.prompt_logprobs is not None and not fr.prompt_logprobs_sent and (token_ids or fr.finished):
        prompt_logprobs, fr.prompt_logprobs_sent = list(fr.prompt_logprobs), True
    return RequestDelta(
        request_id=fr.req_id,
        index=index,
        text=text,
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=fr.finish_reason,
        stop_reason=fr.stop_reason,
        num_prompt_tokens=len(fr.prompt_token_ids),
        num_output_tokens=len(fr.token_ids),
        num_cached_tokens=fr.num_cached_tokens,
        error=fr.error,
        prompt_logprobs=prompt_logprobs,
        pooled=fr.pooled if fr.finished else None,
    )
