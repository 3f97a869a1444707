"""vLLM's read-back of the async decision and its engine-argument spelling (tandem/engine/vllm_compat.py):
vLLM's own regression test for this project's seed reads ``llm.llm_engine.vllm_config.scheduler_config
.async_scheduling`` on an engine built with ``distributed_executor_backend="uni"`` and async scheduling left
unset."""

from __future__ import annotations

import pytest

from tandem import LLM
from tandem.engine.llm import config_from_kwargs


@pytest.mark.parametrize("method", ["draft_model", "ngram", "eagle", "eagle3", "mtp"])
def test_seed_pattern_reads_async_scheduling_true(method: str) -> None:
    spec = {"method": method, "num_speculative_tokens": 2}
    with LLM(speculative_config=spec, distributed_executor_backend="uni", num_kv_blocks=64, max_num_seqs=2) as llm:
        cfg = llm.llm_engine.vllm_config
        assert cfg.scheduler_config.async_scheduling is True
        assert llm.async_scheduling.requested is None and llm.async_scheduling.resolved is True
        assert llm.llm_engine.engine_config is cfg
        assert cfg.parallel_config.distributed_executor_backend == "uni"
        assert cfg.speculative_config.method == method and cfg.speculative_config.num_speculative_tokens == 2
        assert cfg.cache_config.num_gpu_blocks == 64 and cfg.model_config.max_model_len == llm.max_model_len


def test_off_reads_false_and_the_two_backend_names_must_agree() -> None:
    with LLM(async_scheduling=False, num_kv_blocks=32, max_num_seqs=1) as llm:
        assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling is False
    assert config_from_kwargs(distributed_executor_backend="mp").parallel.executor_backend == "mp"
    with pytest.raises(ValueError, match="executor_backend='uni' and distributed_executor_backend='mp' disagree"):
        config_from_kwargs(executor_backend="uni", distributed_executor_backend="mp")


def test_a_pooling_model_reads_false_with_its_reason() -> None:
    """The seed pattern's other branch: a pooling model has nothing to overlap, so async scheduling left
    unset resolves off, and the reason says why."""
    with LLM(runner="pooling", distributed_executor_backend="uni", num_kv_blocks=32, max_num_seqs=1) as llm:
        assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling is False
        assert llm.async_scheduling.requested is None and llm.async_scheduling.reason.value == "pooling_model"
