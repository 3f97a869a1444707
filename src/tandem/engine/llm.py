"""The offline API, shaped like vLLM's ``LLM``: construct once, ``generate`` / ``chat`` many times."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any

from tandem import overrides
from tandem.async_decision import AsyncSchedulingDecision
from tandem.config import DEFAULT_MODEL, EngineConfig, engine_config
from tandem.core.request import RequestStatus
from tandem.engine.builder import Engine, EnginePlan, build_engine
from tandem.engine.metrics import Metric, collect_metrics
from tandem.engine.output_processor import FrontRequest, OutputProcessor
from tandem.engine.prompts import Prompt, PromptInput, normalize_prompts
from tandem.engine.requests import MadeRequest, RequestFactory
from tandem.executor.base import ExecutorError
from tandem.native.omp import release_idle_team
from tandem.engine.vllm_compat import LLMEngineView, engine_view
from tandem.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from tandem.sampling_params import POOLING_PARAMS, SamplingParams
from tandem.trace.tracer import NULL_TRACER, Tracer

class EngineDeadError(RuntimeError):
    """The worker failed; requests in flight were failed and the engine must be rebuilt."""


def config_from_kwargs(model: str = DEFAULT_MODEL, **kw: Any) -> EngineConfig:
    """Engine flags (vLLM names; declared once, as config fields: ``tandem.config.engine_flags``) to an
    ``EngineConfig``; unknown names are an error. ``debug_invariants`` left out: ``TANDEM_DEBUG_INVARIANTS``."""
    if kw.get("debug_invariants") is None:
        kw["debug_invariants"] = overrides.debug_invariants()
    return engine_config(model, **kw)


class LLM:
    def __init__(self, model: str = DEFAULT_MODEL, **kwargs: Any) -> None:
        self.config = config_from_kwargs(model, **kwargs)
        tracer: Tracer = Tracer() if self.config.observability.trace_file else NULL_TRACER
        self._engine: Engine = build_engine(self.config, tracer)
        self.tokenizer = self._engine.tokenizer
        self._out = OutputProcessor(self.tokenizer)
        self._factory = RequestFactory(self._engine, self.config.model.seed)

    # -- read-back -------------------------------------------------------------------------------------
    @property
    def async_scheduling(self) -> AsyncSchedulingDecision:
        return self._engine.plan.decision

    @property
    def engine(self) -> Engine:
        return self._engine

    @cached_property
    def llm_engine(self) -> LLMEngineView:
        """vLLM's read-back: ``llm.llm_engine.vllm_config.scheduler_config.async_scheduling`` (resolved)."""
        return engine_view(self._engine.plan)

    @property
    def engine_plan(self) -> EnginePlan:
        """What runs: the async and quantization decisions, KV blocks, resident weight bytes, kernels."""
        return self._engine.plan

    @property
    def max_model_len(self) -> int:
        return self._engine.plan.max_model_len

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: a new ``SamplingParams`` of the model's generation defaults (``generation_config``,
        ``override_generation_config``), else vLLM's defaults; used when a call gives none."""
        return SamplingParams(**self._engine.generation_defaults)

    def get_metrics(self) -> list[Metric]:
        return collect_metrics(self._engine)

    def spec_decode_stats(self) -> dict[str, object]:
        """Acceptance counters, and the speculation policy's choices and estimates (``policy``)."""
        sched = self._engine.core.scheduler
        return {**sched.counters.spec.as_dict(), "policy": sched.spec_policy.as_dict()}

    def reset_spec_decode_stats(self) -> None:
        from tandem.core.stats import SpecDecodingStats

        self._engine.core.scheduler.counters.spec = SpecDecodingStats()

    # -- requests --------------------------------------------------------------------------------------
    def _make_requests(
        self, prompts: list[Prompt], params: list[SamplingParams]
    ) -> list[MadeRequest]:
        """Validate everything before anything enters the engine."""
        return self._factory.make(prompts, params)

    def generate(
        self,
        prompts: PromptInput,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        if self.config.model.pooling:
            raise ValueError("this engine runs the model as a pooling model (runner='pooling'): use embed()")
        plist = normalize_prompts(prompts)
        if sampling_params is None:
            params = [self.get_default_sampling_params()] * len(plist)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(plist)
        else:
            params = list(sampling_params)
            if len(params) != len(plist):
                raise ValueError(
                    f"got {len(params)} sampling_params for {len(plist)} prompts"
                )
        made, done = self._run(plist, params, use_tqdm)
        return self._group(made, done)

    def embed(self, prompts: PromptInput, use_tqdm: bool = True) -> list[EmbeddingRequestOutput]:
        """vLLM's ``LLM.embed`` (runner ``"pooling"``): each prompt's pooled final hidden state
        (``pooler_config``: LAST or MEAN, normalized by default), computed through the same paged model."""
        if not self.config.model.pooling:
            raise ValueError("embed needs runner='pooling' (vLLM's --runner pooling, or convert='embed')")
        plist = normalize_prompts(prompts)
        made, done = self._run(plist, [POOLING_PARAMS] * len(plist), use_tqdm)
        return [EmbeddingRequestOutput(req.request_id, prompt.text, list(req.prompt_token_ids),
                                       EmbeddingOutput(list(done[req.request_id].pooled or ())))
                for req, prompt, _, _ in made]

    def _run(self, plist: list[Prompt], params: list[SamplingParams],
             use_tqdm: bool) -> tuple[list[MadeRequest], dict[str, FrontRequest]]:
        """Validate, add, and step until every request finished."""
        made = self._make_requests(plist, params)
        if self.config.observability.trace_file:
            self._engine.tracer.clear()  # the trace file holds this call's steps
        self._add(made)
        done: dict[str, FrontRequest] = {}
        bar = _progress(len(made), use_tqdm)
        try:
            while len(done) < len(made):
                for fr in self._pump():
                    if fr.finished and fr.req_id not in done:
                        done[fr.req_id] = fr
                        self._out.pop(fr.req_id)
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        self._flush_trace()
        return made, done

    def generate_stream(
        self, prompt: PromptInput, sampling_params: SamplingParams | None = None
    ) -> Iterator[str]:
        """Yield text deltas of one request as the engine produces them."""
        params = sampling_params or self.get_default_sampling_params()
        if params.n != 1:
            raise ValueError("generate_stream supports n=1 only")
        made = self._make_requests(normalize_prompts(prompt)[:1], [params])
        self._add(made)
        rid = made[0][0].request_id
        fr = self._out.requests[rid]
        try:
            while not fr.finished:
                self._pump()
                delta, _ = fr.take_delta()
                if delta:
                    yield delta
        finally:
            if not fr.finished:
                self._engine.core.abort_requests([rid])
            self._out.pop(rid)
        delta, _ = fr.take_delta()
        if delta:
            yield delta

    # -- step-level API (like vLLM's LLMEngine): add requests any time, step, read what changed --------
    def add_request(self, prompt: PromptInput, sampling_params: SamplingParams | None = None) -> str:
        """Validate and enqueue one request (n must be 1); returns its id. Drive it with :meth:`step`."""
        params = sampling_params or self.get_default_sampling_params()
        if params.n != 1:
            raise ValueError("add_request supports n=1 only; use generate for n > 1")
        made = self._make_requests(normalize_prompts(prompt)[:1], [params])
        self._add(made)
        return made[0][0].request_id

    def step(self) -> list[FrontRequest]:
        """One engine step; returns the requests it changed (finished ones are then forgotten)."""
        changed = self._pump()
        for fr in changed:
            if fr.finish_reason is not None:  # finished
                self._out.pop(fr.req_id)
        return changed

    def abort_request(self, req_ids: list[str]) -> None:
        self._engine.core.abort_requests(req_ids)
        for rid in req_ids:
            self._out.pop(rid)

    def has_unfinished_requests(self) -> bool:
        return self._engine.core.has_unfinished_requests()

    def _add(self, made: list[MadeRequest]) -> None:
        core = self._engine.core
        if core.failed is not None:
            raise EngineDeadError(f"the engine failed: {core.failed}")
        now = time.monotonic()
        for req, prompt, index, _ in made:
            req.arrival_time = now
            self._out.add_request(
                req.request_id, prompt.text, req.prompt_token_ids, req.sampling_params, now, index
            )
            core.add_request(req)

    def _pump(self) -> list[FrontRequest]:
        """One engine step: apply its outputs, finish what stop strings ended."""
        release_idle_team()  # this thread's idle OpenMP team would slow the worker's (native/omp.py)
        core = self._engine.core
        try:
            outs = core.step()
        except ExecutorError as exc:
            raise EngineDeadError(str(exc)) from exc
        changed, stopped = self._out.process(outs)
        if stopped:
            core.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        if core.failed is not None and not changed:
            raise EngineDeadError(f"the engine failed: {core.failed}")
        return changed

    def _group(
        self, made: list[MadeRequest], done: dict[str, FrontRequest]
    ) -> list[RequestOutput]:
        grouped: dict[str, RequestOutput] = {}
        for req, prompt, _index, parent in made:
            fr = done[req.request_id]
            out = grouped.get(parent)
            if out is None:
                out = grouped[parent] = RequestOutput(
                    request_id=parent,
                    prompt=prompt.text,
                    prompt_token_ids=list(req.prompt_token_ids),
                    prompt_logprobs=fr.prompt_logprobs,
                    outputs=[],
                    finished=True,
                    metrics=fr.metrics,
                    num_cached_tokens=fr.num_cached_tokens,
                )
            out.outputs.append(fr.completion())
        return list(grouped.values())

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
    ) -> list[RequestOutput]:
        """vLLM's ``LLM.chat``: each conversation through the chat template (the model's, the engine's
        ``chat_template``, or this call's: a file's path or the template text), then generated."""
        from tandem.model.loader.chat_template import user_chat_template

        template = user_chat_template(chat_template) if chat_template is not None else None
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = []
        for conv in conversations:
            text = self.tokenizer.apply_chat_template(conv, add_generation_prompt=add_generation_prompt,  # type: ignore[arg-type]
                                                      chat_template=template)
            prompts.append({"prompt": text, "add_special_tokens": False})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)  # type: ignore[arg-type]

    # -- lifecycle -------------------------------------------------------------------------------------
    def _flush_trace(self) -> None:
        path = self.config.observability.trace_file
        if path and self._engine.tracer.enabled:
            self._engine.tracer.save(path)

    def shutdown(self) -> None:
        if getattr(self, "_engine", None) is not None:
            self._engine.core.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="Processed prompts", unit="req", dynamic_ncols=True)
