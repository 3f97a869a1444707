"""The native decoder stack for short CPU steps (model/native_decode.py, native/decode_forward.c) against
the torch layers and against transformers, on every tiny checkpoint family; and the few-row product
(native/small_linear.c) against torch."""

from __future__ import annotations

import shutil

import pytest
import torch

from tandem import native
from tandem.model import CausalLM, KVCache
from tandem.model.native_decode import NativeDecode
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.native.decode_forward import decode_forward_kernel
from tandem.native.small_linear import small_linear_kernel
from tests.model.test_transformer_vs_hf import (
    CONFIGS,
    Scenario,
    args_from_hf,
    build_hf,
    hf_reference,
)

pytestmark = pytest.mark.skipif(
    native._compiler() is None and shutil.which("gcc") is None, reason="no C compiler"
)

# Every tiny family, Gemma 3's sandwich norms, GELU and sliding windows included.
NATIVE = sorted(CONFIGS)

LENGTHS = {"A": 9, "B": 14, "C": 3, "D": 22}
PREFILL = [("A", 8), ("B", 10), ("C", 2), ("D", 21)]
# Decodes (A, C, D) and a verify of 3 drafts (B): 7 rows, all short queries.
SHORT_STEP = [("A", 1), ("B", 4), ("C", 1), ("D", 1)]


def _model(name: str, dtype: torch.dtype) -> tuple[CausalLM, object]:
    hf = build_hf(name)
    return CausalLM.from_tensors(args_from_hf(hf.config), hf.state_dict(), dtype=dtype), hf


def _cache(model: CausalLM, sc: Scenario, dtype: torch.dtype) -> KVCache:
    a = model.args
    return KVCache.allocate(
        a.num_hidden_layers, sc.num_blocks, sc.block_size, a.num_key_value_heads, a.head_dim, dtype, "cpu"
    )


def _reference_path(model: CausalLM) -> None:
    model._native, model._native_resolved = None, True


@pytest.mark.parametrize("name", NATIVE)
def test_short_steps_run_natively_and_match_transformers(name: str) -> None:
    model, hf = _model(name, torch.float32)
    sc = Scenario(LENGTHS, block_size=4)
    cache = _cache(model, sc, torch.float32)
    batch, _ = sc.step(PREFILL)
    model(batch, cache)  # prefill chunks: the torch layers
    batch, spans = sc.step(SHORT_STEP)
    aux_layers = [0, model.num_layers - 2]  # transformers normalises its last hidden state
    out = model(batch, cache, aux_hidden_layers=aux_layers)
    assert model._native is not None and model._native.applies(batch), "the native path did not run"
    logits = model.compute_logits(out.hidden_states)
    row = 0
    for req, start, end in spans:
        ref_logits, ref_hidden = hf_reference(hf, sc.reqs[req].tokens)
        n = end - start
        diff = (logits[row : row + n] - ref_logits[start:end]).abs().max().item()
        assert diff < 1e-4, f"{name} request {req}: logits differ from transformers by {diff}"
        for got, layer in zip(out.aux_hidden_states, aux_layers):
            d = (got[row : row + n] - ref_hidden[layer + 1][start:end]).abs().max().item()
            assert d < 1e-4, f"{name} request {req}: aux hidden of layer {layer} differs by {d}"
        row += n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", NATIVE)
def test_native_stack_equals_the_torch_layers(name: str, dtype: torch.dtype) -> None:
    """Same step, same caches: hidden states, captured layers and the K/V written agree."""
    native_model, _ = _model(name, dtype)
    torch_model, _ = _model(name, dtype)
    _reference_path(torch_model)
    sc = Scenario(LENGTHS, block_size=4)
    cache = _cache(native_model, sc, dtype)
    gen = torch.Generator().manual_seed(3)
    for t in (*cache.k, *cache.v):
        t.copy_(torch.randn(t.shape, generator=gen))
    sc.step(PREFILL)  # the context is the random cache contents
    batch, _ = sc.step(SHORT_STEP)
    ref_cache = KVCache([t.clone() for t in cache.k], [t.clone() for t in cache.v])
    aux = [1]
    got = native_model(batch, cache, aux_hidden_layers=aux)
    assert native_model._native is not None and native_model._native.applies(batch)
    batch.attn_metadata = None
    want = torch_model(batch, ref_cache, aux_hidden_layers=aux)
    scale = want.hidden_states.float().abs().max().item()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in ((got.hidden_states, want.hidden_states), (got.aux_hidden_states[0], want.aux_hidden_states[0])):
        d = (a.float() - b.float()).abs().max().item()
        assert d <= tol * max(scale, 1.0), f"{name} {dtype}: native and torch layers differ by {d}"
    for a, b in zip((*cache.k, *cache.v), (*ref_cache.k, *ref_cache.v)):
        d = (a.float() - b.float()).abs().max().item()
        assert d <= tol * 8, f"{name} {dtype}: the K/V written differ by {d}"


def test_native_path_only_for_short_cpu_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _model("llama-tied", torch.float32)
    nd = model._native_decode()
    assert isinstance(nd, NativeDecode)
    sc = Scenario({"A": 12, "B": 30}, block_size=4)
    cache = _cache(model, sc, torch.float32)
    prefill, _ = sc.step([("A", 11), ("B", 10)])
    model(prefill, cache)
    assert not nd.applies(prefill), "a prefill chunk must take the torch layers"
    # Nine short rows, beyond max_rows: the torch layers.
    many = build_forward_batch([PagedRequest([1] * 9, 10, sc.reqs["B"].blocks)], 4)
    model(many, cache)
    assert not nd.applies(many)
    monkeypatch.setenv("TANDEM_NATIVE_DECODE", "0")
    assert NativeDecode.create(model) is None
    bf16, _ = _model("llama-tied", torch.bfloat16)
    monkeypatch.delenv("TANDEM_NATIVE_DECODE")
    assert NativeDecode.create(bf16) is not None


def test_bad_inputs_are_refused() -> None:
    kernel = decode_forward_kernel()
    assert kernel is not None
    model, _ = _model("llama-tied", torch.float32)
    nd = NativeDecode.create(model)
    assert nd is not None
    sc = Scenario({"A": 5}, block_size=4)
    cache = _cache(model, sc, torch.float32)
    bad = KVCache([t[:, :2] for t in cache.k], cache.v)
    with pytest.raises(ValueError, match="cache"):
        nd._layer_table(bad)
    layers = [{"qkv": model.layers[0].qkv, "qkv_bias": None, "qk_norm": None, "o_proj": model.layers[0].o_proj,
               "o_bias": None, "gate_up": model.layers[0].gate_up.t(), "down": model.layers[0].down}]
    with pytest.raises(ValueError, match="gate_up"):
        kernel.layer_table(nd.shape, layers, cache.k[:1], cache.v[:1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(48, 64), (37, 96), (50, 29)])
def test_small_linear_matches_torch(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """Every row count, with and without bias and residual; odd sizes take the portable path."""
    kernel = small_linear_kernel()
    assert kernel is not None
    out, inp = shape
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(out, inp, generator=gen).to(dtype)
    bias = torch.randn(out, generator=gen).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 0.1
    for rows in range(1, kernel.max_rows + 1):
        x = torch.randn(rows, inp, generator=gen).to(dtype)
        res = torch.randn(rows, out, generator=gen).to(dtype)
        ref = x.float() @ w.float().t()
        for b, r in ((None, None), (bias, None), (None, res), (bias, res)):
            want = ref + (0 if b is None else b.float()) + (0 if r is None else r.float())
            got = kernel(x, w, b, r)
            assert got.dtype == dtype and got.shape == (rows, out)
            d = (got.float() - want).abs().max().item()
            assert d < tol * max(1.0, want.abs().max().item()), f"{rows} rows differ by {d}"
    with pytest.raises(ValueError, match="rows"):
        kernel(torch.randn(kernel.max_rows + 1, inp).to(dtype), w)
    with pytest.raises(ValueError, match="x"):
        kernel(torch.randn(2, inp + 1).to(dtype), w)


def test_a_dropped_model_is_freed_without_the_cycle_collector() -> None:
    """The native path must not make a reference cycle: each dropped engine would otherwise keep its
    weights until a full collection (a CI run once grew past 20 GB that way)."""
    import gc
    import weakref

    model, _ = _model("llama-tied", torch.float32)
    sc = Scenario({"A": 6}, block_size=4)
    cache = _cache(model, sc, torch.float32)
    sc.step([("A", 5)])
    batch, _ = sc.step([("A", 1)])
    model(batch, cache)
    assert model._native is not None and model._native._table is not None
    ref = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert ref() is None, "the model outlived its last reference (a reference cycle)"
    finally:
        gc.enable()
