"""Where vLLM users look for an engine's configuration: ``llm.llm_engine.vllm_config`` (alias
``engine_config``), with vLLM's section names. A read-only view of tandem's own records: the resolved values
(``scheduler_config.async_scheduling`` is the resolved bool, not the request); the request / resolved /
reason record stays the primary API (``llm.async_scheduling``, ``llm.engine_plan``)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from tandem.engine.builder import EnginePlan


@dataclass(frozen=True)
class VllmConfigView:
    model_config: Any
    cache_config: Any
    parallel_config: Any
    scheduler_config: Any
    speculative_config: Any


@dataclass(frozen=True)
class LLMEngineView:
    """``LLM.llm_engine``: what vLLM's ``LLMEngine`` exposes of its configuration."""

    vllm_config: VllmConfigView

    @property
    def engine_config(self) -> VllmConfigView:
        return self.vllm_config


def engine_view(plan: EnginePlan) -> LLMEngineView:
    c = plan.config
    model = SimpleNamespace(
        model=c.model.model, dtype=c.model.resolved_dtype(), max_model_len=plan.max_model_len, seed=c.model.seed,
        quantization=plan.quantization.resolved, runner="pooling" if c.model.pooling else "generate",
    )
    cache = SimpleNamespace(
        block_size=c.cache.block_size, num_gpu_blocks=plan.num_kv_blocks,
        enable_prefix_caching=c.cache.enable_prefix_caching,
    )
    parallel = SimpleNamespace(
        tensor_parallel_size=c.parallel.tensor_parallel_size, pipeline_parallel_size=1,
        distributed_executor_backend=c.parallel.executor_backend,
    )
    scheduler = SimpleNamespace(
        async_scheduling=plan.decision.resolved, max_num_seqs=c.scheduler.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        enable_chunked_prefill=c.scheduler.enable_chunked_prefill is not False, max_model_len=plan.max_model_len,
    )
    return LLMEngineView(VllmConfigView(model, cache, parallel, scheduler, c.speculative))
