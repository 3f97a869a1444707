"""A tiny Llama written to GGUF with a matrix of every kernel type (and a type without a kernel), run with
its matrices kept in their blocks (``quantization="gguf"``) against the same file dequantized at load
(``"none"``): the same logits up to summation order and the same greedy tokens, through the native decoder
stack, the torch layers, the torch reference formulation and the engine; and the decision table."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem import LLM, SamplingParams, native
from tandem.engine.builder import plan_engine
from tandem.engine.llm import config_from_kwargs
from tandem.model import CausalLM, KVCache
from tandem.model.block_quant import BlockQuantWeight
from tandem.model.block_quant_linear import QUANT_FEW_ROWS
from tandem.model.linear import create_linear_kernels, rule_block_quant_reference
from tandem.model.loader import load_checkpoint
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.native.quant_linear import quant_linear_kernel
from tandem.quantization import resolve_activations, resolve_quantization
from tests.model.test_loader_gguf import tiny_model, write_gguf
from tests.quant_blocks import Q

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(
    native._compiler() is None and shutil.which("gcc") is None, reason="no C compiler"
)

QUANT = {
    "model.embed_tokens.weight": Q.Q8_0,  # tied: the LM head too
    "model.layers.0.self_attn.q_proj.weight": Q.Q4_K,
    "model.layers.0.self_attn.k_proj.weight": Q.Q8_0,
    "model.layers.0.self_attn.v_proj.weight": Q.Q6_K,
    "model.layers.0.self_attn.o_proj.weight": Q.Q4_1,
    "model.layers.0.mlp.gate_proj.weight": Q.Q5_0,
    "model.layers.0.mlp.up_proj.weight": Q.Q5_K,
    "model.layers.0.mlp.down_proj.weight": Q.Q4_0,
    "model.layers.1.self_attn.q_proj.weight": Q.Q5_1,
    "model.layers.1.self_attn.k_proj.weight": Q.Q5_1,
    "model.layers.1.self_attn.v_proj.weight": Q.Q5_1,
    "model.layers.1.self_attn.o_proj.weight": Q.Q4_K,
    "model.layers.1.mlp.gate_proj.weight": Q.Q4_1,
    "model.layers.1.mlp.up_proj.weight": Q.Q4_1,
    "model.layers.1.mlp.down_proj.weight": Q.Q6_K,
}


def _tiny(path: Path, quant: dict[str, Q] | None = None) -> Path:
    model = tiny_model("llama", tie=True)
    cfg = dict(model.config.to_dict(), hidden_size=256, intermediate_size=512, head_dim=64)
    big = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    with torch.no_grad():
        for name, p in big.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    write_gguf(path, "llama", big.eval(), quant=QUANT if quant is None else quant)
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory.mktemp("bq") / "tiny-q.gguf")


def _models(path: Path, linear: str | None = None) -> tuple[CausalLM, CausalLM]:
    q = load_checkpoint(path, keep_quantized=True)
    f = load_checkpoint(path)
    assert isinstance(q.tensors["model.layers.0.self_attn.q_proj.weight"], BlockQuantWeight)
    assert not isinstance(f.tensors["model.layers.0.self_attn.q_proj.weight"], BlockQuantWeight)
    mq = CausalLM.from_tensors(q.args, q.tensors, linear_kernels=linear)
    mf = CausalLM.from_tensors(f.args, f.tensors, linear_kernels=linear)
    assert mq.quantized and not mf.quantized
    assert mq.layers[0].qkv.types == ("Q4_K", "Q8_0", "Q6_K")  # parts of three types, one matrix
    return mq, mf


def _steps(model: CausalLM) -> list[torch.Tensor]:
    """Logits of a prefill of two prompts, then three decode steps of both (the native stack)."""
    a = model.args
    cache = KVCache.allocate(a.num_hidden_layers, 16, 4, a.num_key_value_heads, a.head_dim, torch.float32, "cpu")
    toks = {"A": [5, 17, 42, 99, 7, 3, 250, 11, 64], "B": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}
    blocks = {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7, 8]}
    done = {"A": 0, "B": 0}
    out = []
    for step in range(4):
        reqs = []
        for rid, ids in toks.items():
            n = len(ids) - done[rid] if step == 0 else 1
            reqs.append(PagedRequest(ids[done[rid] : done[rid] + n], done[rid], blocks[rid]))
        batch = build_forward_batch(reqs, 4, "cpu", last_token_logits_only=True)
        hidden = model(batch, cache).hidden_states[batch.logits_indices]
        logits = model.compute_logits(hidden)
        out.append(logits)
        for rid, logit in zip(toks, logits):
            done[rid] = len(toks[rid])
            toks[rid] = toks[rid] + [int(logit.argmax())]
    return out


@pytest.mark.parametrize("linear", [None, "torch"])
def test_blocks_compute_what_the_dequantized_file_computes(tiny_gguf: Path, linear: str | None) -> None:
    mq, mf = _models(tiny_gguf, linear)
    for lq, lf in zip(_steps(mq), _steps(mf)):
        scale = lf.abs().max()
        torch.testing.assert_close(lq, lf, rtol=0, atol=2e-5 * float(scale))
        assert torch.equal(lq.argmax(-1), lf.argmax(-1))


def test_native_stack_runs_on_blocks_and_matches_the_torch_layers(tiny_gguf: Path) -> None:
    mq, _ = _models(tiny_gguf)
    ref, _ = _models(tiny_gguf)
    ref._native, ref._native_resolved = None, True  # the torch layers only
    native_steps, torch_steps = _steps(mq), _steps(ref)
    assert mq._native is not None and mq._native._table is not None and mq._native._table.block_quant
    for a, b in zip(native_steps, torch_steps):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5 * float(b.abs().max()))


def test_native_stack_takes_wide_short_steps_on_blocks(tiny_gguf: Path) -> None:
    """Beyond the 8 rows of a dense model: a step of decodes and verify rows up to the stack's limit for
    block-quantized layers runs natively (the element-wise work split over threads) and matches the torch
    layers, K/V written included; one row more takes the torch layers."""
    mq, _ = _models(tiny_gguf)
    ref, _ = _models(tiny_gguf)
    ref._native, ref._native_resolved = None, True
    nd = mq._native_decode()
    assert nd is not None and nd.max_rows == QUANT_FEW_ROWS  # parts of several types: not all interleaved
    a = mq.args
    gen = torch.Generator().manual_seed(5)
    q_lens = [1, 4, 1, 4, 1, 4, 1]  # 16 rows: four decodes, three verifies of 3 drafts
    assert sum(q_lens) == nd.max_rows
    cache = KVCache.allocate(a.num_hidden_layers, 8 * len(q_lens), 4, a.num_key_value_heads, a.head_dim,
                             torch.float32, "cpu")
    for t in (*cache.k, *cache.v):
        t.copy_(torch.randn(t.shape, generator=gen))
    ref_cache = KVCache([t.clone() for t in cache.k], [t.clone() for t in cache.v])
    context = [3 + 4 * i for i in range(len(q_lens))]

    def batch(extra: int = 0):  # type: ignore[no-untyped-def]
        reqs = [PagedRequest(torch.randint(0, a.vocab_size, (q + (extra if i == 0 else 0),), generator=gen).tolist(),
                             c, list(range(8 * i, 8 * i + 8))) for i, (q, c) in enumerate(zip(q_lens, context))]
        return build_forward_batch(reqs, 4, "cpu")

    wide = batch()
    got = mq(wide, cache).hidden_states
    assert nd.applies(wide), "the native stack did not run"
    wide.attn_metadata = None
    want = ref(wide, ref_cache).hidden_states
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * float(want.abs().max()))
    for x, y in zip((*cache.k, *cache.v), (*ref_cache.k, *ref_cache.v)):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-4)
    beyond = batch(extra=1)
    mq(beyond, cache)
    assert not nd.applies(beyond), "a step beyond the limit must take the torch layers"


INTERLEAVED_QUANT = {name: (Q.Q8_0 if "embed" in name or "k_proj" in name else Q.Q4_1) for name in QUANT}


@pytest.mark.parametrize("activations", ["int8x2", "float32"])
def test_native_stack_takes_steps_past_the_product_kernels_rows_in_slices(
        tmp_path: Path, activations: str) -> None:
    """Every part interleaved and multiplying int8 activations with VNNI: the torch layers run a wide
    product in slices of rows through the few-row kernel (``int8_rows``), so the stack takes any step its
    kernel does (``max_rows``, 256), its products in the same slices: a 200-row step of decodes and verifies
    runs natively and matches the torch layers, K/V included, and the plan from the file's index says the
    same. Without VNNI (AVX2's int8 path included: block_quant_linear.int8_rows says why), or with float32
    activations, the stack stops at the few-row kernels' 64 rows."""
    from tandem.model.block_quant_linear import QUANT_FEW_ROWS_INTERLEAVED
    from tandem.model.native_decode import planned_stack_rows
    from tandem.native.decode_forward import decode_forward_kernel

    path = _tiny(tmp_path / "tiny-r16.gguf", INTERLEAVED_QUANT)
    ckpt = load_checkpoint(path, keep_quantized=True)
    mq = CausalLM.from_tensors(ckpt.args, ckpt.tensors, quant_activations=activations)
    ref = CausalLM.from_tensors(ckpt.args, ckpt.tensors, quant_activations=activations)
    ref._native, ref._native_resolved = None, True
    nd = mq._native_decode()
    assert nd is not None and all(m.all_interleaved for m in (mq.layers[0].qkv, mq.layers[1].down))
    sliced = activations != "float32" and quant_linear_kernel().vnni  # type: ignore[union-attr]
    kernel_rows = decode_forward_kernel().max_rows  # type: ignore[union-attr]
    assert kernel_rows > QUANT_FEW_ROWS_INTERLEAVED
    assert nd.max_rows == (kernel_rows if sliced else QUANT_FEW_ROWS_INTERLEAVED)
    assert planned_stack_rows(["Q4_1", "Q8_0"], kernel_rows, sliced) == nd.max_rows
    assert planned_stack_rows(["Q4_1", "Q6_K"], kernel_rows, True) == QUANT_FEW_ROWS  # not every part interleaved
    if not sliced:
        return
    a = mq.args
    gen = torch.Generator().manual_seed(7)
    q_lens = [1, 4] * 40  # 200 rows: 40 decodes, 40 verifies of 3 drafts
    cache = KVCache.allocate(a.num_hidden_layers, 4 * len(q_lens), 4, a.num_key_value_heads, a.head_dim,
                             torch.float32, "cpu")
    for t in (*cache.k, *cache.v):
        t.copy_(torch.randn(t.shape, generator=gen))
    ref_cache = KVCache([t.clone() for t in cache.k], [t.clone() for t in cache.v])
    reqs = [PagedRequest(torch.randint(0, a.vocab_size, (q,), generator=gen).tolist(), 3 + (i % 7),
                         list(range(4 * i, 4 * i + 4))) for i, q in enumerate(q_lens)]
    wide = build_forward_batch(reqs, 4, "cpu")
    got = mq(wide, cache).hidden_states
    assert wide.num_tokens == 200 > QUANT_FEW_ROWS_INTERLEAVED and nd.applies(wide), "the native stack did not run"
    wide.attn_metadata = None
    want = ref(wide, ref_cache).hidden_states
    # int8 activations: a last-bit difference in a norm can move a rounding step of the next product's input,
    # so the two formulations differ by ~1e-4 of the range at any row count (5 rows alike); a row in the
    # wrong slice would be off by the range itself
    torch.testing.assert_close(got, want, rtol=0, atol=2e-4 * float(want.abs().max()))
    for x, y in zip((*cache.k, *cache.v), (*ref_cache.k, *ref_cache.v)):
        torch.testing.assert_close(x, y, rtol=0, atol=2e-4 * float(y.abs().max()))


def test_resident_bytes_are_the_blocks(tiny_gguf: Path) -> None:
    mq, mf = _models(tiny_gguf)
    assert mq.weight_nbytes() < 0.4 * mf.weight_nbytes()
    plan = plan_engine(config_from_kwargs(str(tiny_gguf)), log=False)
    got = plan.quantization.as_dict()
    assert {k: got[k] for k in ("requested", "resolved", "reason")} == {
        "requested": None, "resolved": "gguf", "reason": "quantized_gguf"
    }
    assert got["activations"]["resolved"] == ("int8x2" if quant_linear_kernel().int8_simd else "float32")  # type: ignore[index,union-attr]
    assert plan.weight_bytes == mq.weight_nbytes()
    kernels: Any = plan.kernels
    assert kernels["compiled"] == native.cpu_isa() and set(kernels) >= {"Q4_K", "Q8_0", "Q6_K", "Q5_1"}
    none = plan_engine(config_from_kwargs(str(tiny_gguf), quantization="none"), log=False)
    assert none.weight_bytes == mf.weight_nbytes() and none.kernels is None


def test_engine_greedy_tokens_equal_with_and_without_blocks(tiny_gguf: Path) -> None:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    prompts = [[5, 17, 42, 99], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
    outs = {}
    for q in ("gguf", "none"):
        with LLM(str(tiny_gguf), quantization=q, max_num_seqs=2, block_size=4, num_kv_blocks=32) as llm:
            assert llm.engine_plan.quantization.resolved == q
            outs[q] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    assert outs["gguf"] == outs["none"]


def test_a_type_without_a_kernel_is_dequantized_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _tiny(tmp_path / "q2k.gguf", {**QUANT, "model.layers.1.mlp.up_proj.weight": Q.Q2_K})
    with caplog.at_level("WARNING"):
        ckpt = load_checkpoint(path, keep_quantized=True)
    assert "no native kernel for Q2_K" in caplog.text
    up = ckpt.tensors["model.layers.1.mlp.up_proj.weight"]
    assert isinstance(up, torch.Tensor) and up.dtype == torch.float32
    with pytest.raises(ValueError, match="up_proj.*quantization 'gguf'"):
        CausalLM.from_tensors(ckpt.args, ckpt.tensors)
    # auto keeps the file usable: that checkpoint is served dequantized only where it must be
    assert isinstance(ckpt.tensors["model.layers.1.mlp.gate_proj.weight"], BlockQuantWeight)


def test_decision_table() -> None:
    kw = {"dtype": "float32", "device": "cpu", "tensor_parallel_size": 1}
    r = resolve_quantization
    got = r(None, quantized_gguf=True, **kw)
    assert (got.requested, got.resolved, got.reason) == (None, "gguf", "quantized_gguf")
    assert r("auto", quantized_gguf=False, **kw).resolved == "none"
    assert r("none", quantized_gguf=True, **kw).reason == "explicit"
    assert r(None, quantized_gguf=True, **{**kw, "dtype": "bfloat16"}).reason == "dtype"
    assert r(None, quantized_gguf=True, **{**kw, "device": "cuda"}).reason == "device"
    assert r(None, quantized_gguf=True, **{**kw, "tensor_parallel_size": 2}).reason == "tensor_parallel"
    with pytest.raises(ValueError, match="quantization 'gguf'.*tensor_parallel"):
        r("gguf", quantized_gguf=True, **{**kw, "tensor_parallel_size": 2})
    with pytest.raises(ValueError, match="quantization 'gguf'.*not_quantized_gguf"):
        r("gguf", quantized_gguf=False, **kw)
    with pytest.raises(ValueError, match="quantization must be one of"):
        config_from_kwargs(quantization="int4")
    # The reference formulation multiplies block-quantized weights by gguf-py's dequantization.
    assert create_linear_kernels("torch").rules(BlockQuantWeight) == (rule_block_quant_reference,)


def test_activation_decision_table() -> None:
    kw = {"dtype": "float32", "device": "cpu", "tensor_parallel_size": 1}
    gguf = resolve_quantization(None, quantized_gguf=True, **kw)
    none = resolve_quantization("none", quantized_gguf=True, **kw)
    a = resolve_activations
    def got(d, requested, path):  # type: ignore[no-untyped-def]
        r = a(d, requested, path)
        return r.activations, r.activations_reason

    assert got(gguf, None, "vnni") == ("int8x2", "vnni") and got(gguf, None, "avx2") == ("int8x2", "avx2")
    assert got(gguf, "auto", "portable") == ("float32", "no_simd_int8") == got(gguf, None, None)
    assert got(gguf, "int8", "portable") == ("int8", "explicit")
    assert got(gguf, "float32", "avx2") == ("float32", "explicit")
    assert got(none, None, "vnni") == ("float32", "not_gguf")
    assert got(none, "float32", "vnni") == ("float32", "explicit")
    with pytest.raises(ValueError, match="quant_activations 'int8x2' needs quantization 'gguf'"):
        a(none, "int8x2", "vnni")
    with pytest.raises(ValueError, match="quant_activations must be one of"):
        config_from_kwargs(quant_activations="int4")


def test_int8_activations_stay_close_to_the_float_products(tiny_gguf: Path) -> None:
    """A random tiny model amplifies input errors far more than a trained one: int8x2's logits (inputs off by
    <= max|x| / 64516 per block) stay within 1e-3 of the logits' scale (measured 3e-4), and at least ten times
    closer than one level's (llama.cpp's int8, measured ~0.14 of the scale here)."""
    q = load_checkpoint(tiny_gguf, keep_quantized=True)
    mf = CausalLM.from_tensors(q.args, q.tensors)
    err = {}
    for act in ("int8x2", "int8"):
        m8 = CausalLM.from_tensors(q.args, q.tensors, quant_activations=act)
        assert m8.layers[1].gate_up.activations == act and "Q4_1x16" in m8.layers[1].gate_up.layouts
        err[act] = max(float((l8 - lf).abs().max() / lf.abs().max()) for l8, lf in zip(_steps(m8), _steps(mf)))
    assert err["int8x2"] <= 1e-3 and 10 * err["int8x2"] < err["int8"]


def test_tandem_config_shows_the_default_models_quantization(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tandem.entrypoints.cli import main as cli_main

    assert cli_main(["config", "--json"]) in (0, None)
    doc = json.loads(capsys.readouterr().out)
    kernel = quant_linear_kernel()
    assert kernel is not None
    simd = kernel.int8_simd
    assert simd == (kernel.int8_path in ("vnni", "avx2")) and kernel.int8_path == (
        "vnni" if kernel.vnni else ("avx2" if native.cpu_isa() in ("avx2", "avx512") else "portable"))
    assert doc["quantization"] == {
        "requested": None, "resolved": "gguf", "reason": "quantized_gguf",
        "activations": {"requested": None, "resolved": "int8x2" if simd else "float32",
                        "reason": kernel.int8_path if simd else "no_simd_int8"},
    }  # fmt: skip
    assert doc["kernels"]["activations"] == doc["quantization"]["activations"]["resolved"]
    assert 90e6 < doc["weight_bytes"] < 100e6  # the Q4_1 / Q8_0 blocks (the file is 98 MB), not 538 MB of fp32
    assert set(doc["kernels"]) >= {"isa", "compiled", "Q4_1", "Q8_0"}
    # the whole stack's rows in the kernels' table are the ones the engine plans (256 with VNNI, 64 without)
    assert doc["native_decode_rows"] == (256 if kernel.vnni else 64)
    assert f"1-{doc['native_decode_rows']} rows, whole stack" in doc["kernels"]["Q4_1"]
    assert cli_main(["config", "--json", "--quantization", "none"]) in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["quantization"]["resolved"] == "none" and doc["weight_bytes"] > 500e6 and doc["kernels"] is None
    # tensor parallelism dequantizes (auto) and refuses an explicit 'gguf' with the reason
    doc_tp = plan_engine(config_from_kwargs(tensor_parallel_size=2, executor_backend="mp"), log=False)
    assert doc_tp.quantization.reason == "tensor_parallel"
    with pytest.raises(ValueError, match="quantization 'gguf'.*tensor_parallel"):
        plan_engine(config_from_kwargs(tensor_parallel_size=2, executor_backend="mp", quantization="gguf"), log=False)


def test_isa_override_is_one_variable_shown_in_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_NATIVE_ISA", "portable")
    plan = plan_engine(config_from_kwargs(), log=False).as_dict()
    assert plan["overrides"] == {"TANDEM_NATIVE_ISA": "portable"}
    assert plan["kernels"]["isa"] == "portable" and plan["kernels"]["compiled"] == "portable"  # type: ignore[index]
    # the portable build has no SIMD int8 path: auto keeps float32 activations and says why
    assert plan["quantization"]["activations"] == {"requested": None, "resolved": "float32", "reason": "no_simd_int8"}  # type: ignore[index]
