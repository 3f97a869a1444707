"""What computes a step (tandem/execution.py): resolved once from the device and the overrides, shown by
``tandem config --json``, and built by every worker as the engine resolved it, whatever the worker's own
environment says (the Ray case, whose actors never see the engine's environment, is in
tests/distributed/test_ray_executor.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tandem import LLM, native
from tandem.engine.llm import config_from_kwargs
from tandem.execution import ExecutionPlan, resolve_execution
from tandem.executor.multiproc import MultiprocExecutor
from tandem.worker.worker import WorkerSpec
from tests.spec_decode.tiny_heads import tiny_target

KNOBS = ("TANDEM_ATTENTION_BACKEND", "TANDEM_LINEAR_KERNELS", "TANDEM_NATIVE_DECODE", "TANDEM_NATIVE",
         "TANDEM_NATIVE_ISA", "TANDEM_SAMPLING_NOISE")  # fmt: skip


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults_then_overrides_resolve_and_bad_names_are_refused(clean_env: pytest.MonkeyPatch) -> None:
    plan = resolve_execution("cpu")
    assert plan.attention_backend == "paged_cpu" and plan.native and plan.native_isa == "native"
    if native.compiled_isa() is not None:
        assert plan.linear_kernels == "native" and plan.native_decode and plan.compiled_isa == native.cpu_isa()
    clean_env.setenv("TANDEM_ATTENTION_BACKEND", "sdpa")
    clean_env.setenv("TANDEM_LINEAR_KERNELS", "torch")
    clean_env.setenv("TANDEM_NATIVE_DECODE", "0")
    over = resolve_execution("cpu")
    assert (over.attention_backend, over.linear_kernels, over.native_decode) == ("sdpa", "torch", False)
    clean_env.setenv("TANDEM_ATTENTION_BACKEND", "flash")
    with pytest.raises(ValueError, match="TANDEM_ATTENTION_BACKEND='flash'"):
        resolve_execution("cpu")
    with pytest.raises(ValueError, match="linear_kernels 'fast'"):
        ExecutionPlan("sdpa", "fast", False, True, "native", None)
    with pytest.raises(ValueError, match="native_isa 'arm'"):
        ExecutionPlan("sdpa", "torch", False, True, "arm", None)
    with pytest.raises(ValueError, match="sampling_noise 'gpu'"):
        ExecutionPlan("sdpa", "torch", False, True, "native", None, "gpu")


def test_the_sampling_noise_resolves_and_its_override_is_honoured(clean_env: pytest.MonkeyPatch) -> None:
    """On the CPU with the native kernels the rows' numbers come from the native streams; ``TANDEM_SAMPLING_NOISE``
    asks for torch generators (an A/B, or the numbers seeded requests drew before the streams), native kernels
    off give generators too, and a name that is neither is refused naming the variable."""
    from tandem.sample import rng

    native_ok = rng.sample_noise_kernel() is not None
    assert resolve_execution("cpu").sampling_noise == ("native" if native_ok else "torch")
    clean_env.setenv("TANDEM_SAMPLING_NOISE", "torch")
    assert resolve_execution("cpu").sampling_noise == "torch"
    assert isinstance(rng.make_row_rng(1, "cpu"), torch.Generator)
    clean_env.setenv("TANDEM_SAMPLING_NOISE", "native")
    assert resolve_execution("cpu").sampling_noise == ("native" if native_ok else "torch")
    clean_env.setenv("TANDEM_SAMPLING_NOISE", "gpu")
    with pytest.raises(ValueError, match="TANDEM_SAMPLING_NOISE='gpu'"):
        resolve_execution("cpu")
    clean_env.delenv("TANDEM_SAMPLING_NOISE")
    clean_env.setenv("TANDEM_NATIVE", "0")
    assert resolve_execution("cpu").sampling_noise == "torch"


def test_tandem_config_json_shows_the_resolved_choice(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tandem.entrypoints.cli import main

    clean_env.setenv("TANDEM_LINEAR_KERNELS", "cpu")
    assert main(["config", "--model", str(tiny_target(tmp_path)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["execution"] == resolve_execution("cpu").as_dict()
    assert doc["execution"]["linear_kernels"] == "cpu" and doc["overrides"] == {"TANDEM_LINEAR_KERNELS": "cpu"}


def test_an_mp_worker_builds_the_engines_choice(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model = str(tiny_target(tmp_path))
    # A choice this worker's environment does not give: the spec's plan, not the environment, decides.
    chosen = ExecutionPlan("sdpa", "torch", False, True, native.default_isa(), native.compiled_isa())
    spec = WorkerSpec(config_from_kwargs(model), False, 16, 256, frozenset(), execution=chosen)
    executor = MultiprocExecutor.create(spec)
    try:
        assert executor.worker_execution == [chosen.as_dict()]
    finally:
        executor.shutdown()
    # Through the engine: an override set in the engine process reaches the worker as resolved there.
    clean_env.setenv("TANDEM_ATTENTION_BACKEND", "naive")
    llm = LLM(model=model, executor_backend="mp", max_model_len=128)
    try:
        built = llm.engine.core.executor.worker_execution
        assert built == [resolve_execution("cpu").as_dict()] and built[0]["attention_backend"] == "naive"
    finally:
        llm.shutdown()


@pytest.mark.skipif(native.compiled_isa() is None, reason="no native kernels")
def test_the_planned_native_decode_rows_are_the_built_stacks(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The plan's ``native_decode_rows`` (from the file's index, before loading; the speculation policy keeps
    drafts within it) equals what the worker's native decoder stack takes: the shipped GGUF model (interleaved
    blocks) and a dense checkpoint; 0 with the stack switched off."""
    for model, kwargs in (("smollm2-135m-instruct", {"kv_cache_memory": 64 << 20}),
                          (str(tiny_target(tmp_path)), {})):
        llm = LLM(model=model, max_model_len=128, **kwargs)
        try:
            stack = llm.engine.core.executor.runner.model._native_decode()
            assert stack is not None and llm.engine_plan.native_decode_rows == stack.max_rows > 0, model
        finally:
            llm.shutdown()
    clean_env.setenv("TANDEM_NATIVE_DECODE", "0")
    llm = LLM(model=str(tiny_target(tmp_path)), max_model_len=128)
    try:
        assert llm.engine_plan.native_decode_rows == 0
    finally:
        llm.shutdown()


def test_the_planned_draft_weights_are_the_built_heads(clean_env: pytest.MonkeyPatch) -> None:
    """``tandem config``'s ``draft_weights`` (from the plan, before loading) is what the proposer builds: the
    shipped EAGLE-3 head on the default GGUF model in Q8_0 blocks where the target's products take int8
    activations (the default with VNNI), per-feature int8 where they take float32; an explicit dtype as asked."""
    from tandem.model.block_quant import BlockQuantWeight
    from tandem.model.quant import Int8Weight

    built = {"q8_0": BlockQuantWeight, "int8": Int8Weight}
    for acts, draft_dtype in ((None, None), ("float32", None), (None, "int8")):
        spec = {"method": "eagle3", "num_speculative_tokens": 2, "draft_dtype": draft_dtype}
        llm = LLM(max_model_len=128, kv_cache_memory=32 << 20, quant_activations=acts, speculative_config=spec)
        try:
            plan = llm.engine_plan.draft_weights()
            head = llm.engine.core.executor.runner.proposer.head
            assert plan is not None and isinstance(head.qkv, built[str(plan["resolved"])]), (acts, draft_dtype, plan)
            if acts == "float32" or draft_dtype == "int8":
                assert plan["resolved"] == "int8"
            if plan["resolved"] == "q8_0":
                assert head.qkv.activations == plan["activations"] == llm.engine_plan.quantization.activations
        finally:
            llm.shutdown()
