"""vLLM's calls with the import changed (issue: "vLLM drop-in"): engine arguments tandem honours with vLLM's
meaning (generation_config, max_logprobs, gpu_memory_utilization, enable_chunked_prefill, disable_log_stats),
``SamplingParams`` as vLLM's scripts use it (set after construction, top_k 0, truncate_prompt_tokens,
output_kind), and the reader classes of ``get_metrics``. A tiny random checkpoint; every test ends with the
engine idle and its blocks free."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.config import ModelConfig, engine_config
from tandem.engine.async_llm import AsyncLLM
from tandem.engine.builder import plan_engine
from tandem.engine.generation_defaults import generation_defaults
from tandem.engine.prompts import Prompt
from tandem.engine.stats_logger import StatsLogger
from tandem.sampling_params import RequestOutputKind
from tandem.v1.metrics.reader import Counter, Gauge, Vector
from tests.spec_decode.tiny_heads import tiny_target

KW = dict(max_num_seqs=4, max_model_len=64, num_kv_blocks=64)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tiny_target(tmp_path_factory.mktemp("dropin"))
    (directory / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "top_k": 5, "max_new_tokens": 3, "do_sample": False, "bos_token_id": 1}))
    return directory


def _idle(llm: LLM) -> None:
    sched = llm.engine.core.scheduler
    assert not sched.requests and sched.kv.all_free()


def test_sampling_params_as_vllm_scripts_use_them() -> None:
    sp = SamplingParams()
    sp.max_tokens, sp.temperature, sp.top_k = 7, 0.5, 0  # generate.py's pattern; vLLM's 0 = top-k off
    assert (sp.max_tokens, sp.temperature, sp.top_k) == (7, 0.5, -1)
    with pytest.raises(ValueError, match="temperature must be non-negative"):
        sp.temperature = -1.0
    assert sp.temperature == 0.5  # a refused assignment changes nothing
    with pytest.raises(ValueError, match="unknown sampling field 'no_such'"):
        sp.no_such = 1
    sp = SamplingParams(truncate_prompt_tokens=4, extra_args={"k": 1}, spaces_between_special_tokens=False,
                        output_kind=1, logprobs=-1)
    assert sp.output_kind is RequestOutputKind.DELTA and sp.extra_args == {"k": 1}
    for bad, field in [({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
                       ({"extra_args": [1]}, "extra_args"), ({"output_kind": 9}, "output_kind"),
                       ({"logprobs": -2}, "logprobs"), ({"spaces_between_special_tokens": 1}, "spaces_between")]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**bad)


def test_generation_config_gives_the_defaults(target: Path, tmp_path: Path) -> None:
    assert generation_defaults(ModelConfig(model=str(target))) == {"temperature": 0.0, "top_k": 5, "max_tokens": 3}
    assert generation_defaults(ModelConfig(model=str(target), generation_config="vllm")) == {}
    over = ModelConfig(model=str(target), override_generation_config={"temperature": 0.25, "max_new_tokens": 5})
    assert generation_defaults(over) == {"temperature": 0.25, "top_k": 5, "max_tokens": 5}
    with pytest.raises(ValueError, match="generation_config='/no/such': no generation_config.json"):
        generation_defaults(ModelConfig(model=str(target), generation_config="/no/such"))
    with pytest.raises(ValueError, match="override_generation_config: temperature must be non-negative"):
        generation_defaults(ModelConfig(model=str(target), override_generation_config={"temperature": -1}))
    llm = LLM(str(target), **KW)
    sp = llm.get_default_sampling_params()
    assert (sp.temperature, sp.top_k, sp.max_tokens) == (0.0, 5, 3)
    out = llm.generate("hello there", use_tqdm=False)[0].outputs[0]  # no params: the model's defaults
    assert len(out.token_ids) == 3 or out.finish_reason == "stop"
    again = llm.generate("hello there", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    assert again.outputs[0].token_ids == out.token_ids
    _idle(llm)
    llm.shutdown()


def test_max_logprobs_truncation_and_metric_classes(target: Path) -> None:
    llm = LLM(str(target), max_logprobs=2, generation_config="vllm", tokenizer=str(target), **KW)
    assert llm.engine.plan.config.model.tokenizer_source == str(target)
    with pytest.raises(ValueError, match=r"logprobs=3 is more than the engine's max_logprobs \(2\)"):
        llm.generate("hi", SamplingParams(logprobs=3), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_logprobs=-1 is more than"):
        llm.generate("hi", SamplingParams(prompt_logprobs=-1), use_tqdm=False)
    greedy = SamplingParams(temperature=0, max_tokens=2, logprobs=2)
    ids = list(range(10, 30))
    cut = llm.generate({"prompt_token_ids": ids}, greedy.clone(truncate_prompt_tokens=5), use_tqdm=False)[0]
    last5 = llm.generate({"prompt_token_ids": ids[-5:]}, greedy, use_tqdm=False)[0]
    assert cut.prompt_token_ids == ids[-5:] and cut.outputs[0].token_ids == last5.outputs[0].token_ids
    assert all(len(entry) >= 2 for entry in cut.outputs[0].logprobs)
    metrics = {m.name: m for m in llm.get_metrics()}
    assert isinstance(metrics["vllm:prompt_tokens"], Counter) and metrics["vllm:prompt_tokens"].value == 10
    assert isinstance(metrics["vllm:num_requests_running"], Gauge)
    assert isinstance(metrics["vllm:spec_decode_num_accepted_tokens_per_pos"], Vector)
    _idle(llm)
    llm.shutdown()
    wide = LLM(str(target), max_logprobs=-1, generation_config="vllm", **KW)
    out = wide.generate("hi", SamplingParams(temperature=0, max_tokens=1, logprobs=-1), use_tqdm=False)[0]
    assert len(out.outputs[0].logprobs[0]) == wide.engine.plan.args.vocab_size
    _idle(wide)
    wide.shutdown()


def test_chunked_prefill_off_budget_and_the_stats_line(target: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert plan_engine(engine_config(str(target), enable_chunked_prefill=False, **KW)).max_num_batched_tokens == 2048
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(32\) is smaller than max_model_len \(64\) with "
                                         "enable_chunked_prefill=False"):
        plan_engine(engine_config(str(target), enable_chunked_prefill=False, max_num_batched_tokens=32, **KW))
    assert plan_engine(engine_config(str(target), max_num_batched_tokens=32, **KW)).max_num_batched_tokens == 32
    llm = LLM(str(target), enable_chunked_prefill=False, disable_log_stats=False, generation_config="vllm", **KW)
    assert llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill is False
    assert llm.engine.core.stats_logger is not None
    llm.engine.core.stats_logger.interval_s = 0.0
    with caplog.at_level(logging.INFO, logger="tandem.stats"):
        llm.generate("hello", SamplingParams(max_tokens=2), use_tqdm=False)
    assert any("Avg generation throughput" in r.message and "KV cache usage" in r.message for r in caplog.records)
    _idle(llm)
    llm.shutdown()
    line = StatsLogger(interval_s=0.0).maybe_log(llm.engine.core.scheduler)
    assert line is not None and "Running: 0 reqs, Waiting: 0 reqs" in line
    assert StatsLogger(interval_s=3600).maybe_log(llm.engine.core.scheduler) is None


def test_gpu_memory_utilization_sizes_the_kv_cache_from_the_machines_memory(target: Path) -> None:
    total = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]) * 1024
    plan = plan_engine(engine_config(str(target), gpu_memory_utilization=0.05, max_num_seqs=2))
    kv = plan.num_kv_blocks * plan.bytes_per_block
    assert 0 < kv <= 0.05 * total and kv > 0.05 * total - 8 * 2**30  # less what the process holds
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.0 asks for"):
        plan_engine(engine_config(str(target), gpu_memory_utilization=1.0))
    explicit = plan_engine(engine_config(str(target), gpu_memory_utilization=0.05, kv_cache_memory=1 << 20))
    assert explicit.num_kv_blocks * explicit.bytes_per_block <= 1 << 20  # an explicit budget wins


def test_async_output_kinds(target: Path) -> None:
    eng = AsyncLLM(str(target), generation_config="vllm", **KW)

    async def run(kind: RequestOutputKind) -> list:
        sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, output_kind=kind)
        return [d async for d in eng.generate([Prompt("hello", None)], [sp], f"k{int(kind)}")]

    cumulative, deltas, final = (asyncio.run(run(k)) for k in RequestOutputKind)
    tokens = [t for d in deltas for t in d.token_ids]
    assert len(tokens) == 4 and cumulative[-1].token_ids == tokens and [d.token_ids for d in final] == [tokens]
    assert [len(d.token_ids) for d in cumulative] == sorted(len(d.token_ids) for d in cumulative)
    assert cumulative[-1].text == "".join(d.text for d in deltas) == final[0].text
    eng.shutdown()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_memory_utilization_on_cuda_is_a_fraction_of_the_device(target: Path) -> None:
    free, total = torch.cuda.mem_get_info()
    plan = plan_engine(engine_config(str(target), device="cuda", gpu_memory_utilization=0.05, max_num_seqs=2))
    kv = plan.num_kv_blocks * plan.bytes_per_block
    assert 0 < kv <= 0.05 * total - (total - free)
