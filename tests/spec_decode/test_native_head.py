"""The draft head's layer in one native call (``spec_decode/native_head.py``) against the torch layer
(``DraftHead.layer``) on the same inputs and the same KV cache: outputs and the K/V it writes, for every
method, float32 and bf16 head weights (under float32 activations), decode and verify rows of several
requests; and where it does not apply (prefill chunks) the proposer takes the torch layer."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tandem.config import SpeculativeConfig
from tandem.model.loader import load_checkpoint
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.model.transformer import CausalLM
from tandem.native.decode_forward import decode_forward_kernel
from tandem.spec_decode.eagle import DraftHeadProposer
from tandem.spec_decode.factory import build_proposer
from tests.spec_decode.tiny_heads import H, add_mtp, tiny_target, write_eagle, write_eagle3

V = 261
BS = 16
pytestmark = pytest.mark.skipif(decode_forward_kernel() is None, reason="native kernels unavailable")


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("nh")
    plain, mtp = tiny_target(tmp / "t"), add_mtp(tiny_target(tmp / "m"))
    return {
        "eagle": ({"method": "eagle", "model": str(write_eagle(tmp / "e", V))}, plain),
        "eagle3": ({"method": "eagle3", "model": str(write_eagle3(tmp / "e3", V, 100, d2t=torch.arange(100)))}, plain),
        "mtp": ({"method": "mtp"}, mtp),
    }


def _proposer(targets: dict[str, Any], method: str, draft_dtype: str) -> DraftHeadProposer:
    spec, directory = targets[method]
    ckpt = load_checkpoint(directory)
    model = CausalLM.from_tensors(ckpt.args, ckpt.tensors)
    config = SpeculativeConfig(num_speculative_tokens=3, draft_dtype=draft_dtype, **spec)
    p = build_proposer(config, target=model, target_checkpoint=ckpt, num_kv_blocks=8, block_size=BS)
    assert isinstance(p, DraftHeadProposer)
    return p


@pytest.mark.parametrize("draft_dtype", ["float32", "bfloat16", "int8", "q8_0"])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_native_layer_equals_torch_layer(targets: dict[str, Any], method: str, draft_dtype: str) -> None:
    p = _proposer(targets, method, draft_dtype)
    assert p.native is not None and p.head.weight_dtype == getattr(torch, draft_dtype.replace("q8_0", "int8"))
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = p.kv_cache.k[0], p.kv_cache.v[0]
    k_cache.copy_(torch.randn(k_cache.shape, generator=gen))
    v_cache.copy_(torch.randn(v_cache.shape, generator=gen))
    # A verify of 3 drafts after 20 cached tokens, a decode after 5, a decode after 33 (3 blocks).
    batch = build_forward_batch(
        [PagedRequest([7, 8, 9, 10], 20, [0, 1]), PagedRequest([11], 5, [2]), PagedRequest([12], 33, [3, 4, 5])], BS
    )
    meta = p.backend.build_metadata(batch, BS)
    feat = torch.randn(batch.num_tokens, H, generator=gen)
    residual, attn_in = p.head.layer_input(batch.input_ids, feat)
    k0, v0 = k_cache.clone(), v_cache.clone()
    ref = p.head.layer(residual, attn_in, batch.positions, p._attend(meta))
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    k_cache.copy_(k0)
    v_cache.copy_(v0)
    res_before = residual.clone()
    out = p.native(residual, attn_in, batch.positions, meta)
    assert out is not None, "the native layer did not take a short step"
    assert torch.equal(residual, res_before)  # the residual is not modified in place
    # bf16 weights: the native layer folds the post-attention gain into a bf16 copy of gate/up (one more
    # rounding of those weights than the torch layer, which scales the activations), so the outputs agree to
    # bf16's precision; the K/V come from the same q/k/v weights in both and agree to float32's. int8: the
    # folded gate/up is quantized afresh (its own int8 rounding, up to half a step of its scale). q8_0: the
    # blocks take the gain on their input (no second rounding): the same products, float32 roundings apart.
    tol = {"float32": 1e-5, "bfloat16": 3e-2, "int8": 6e-2, "q8_0": 1e-4}[draft_dtype]
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    torch.testing.assert_close(k_cache, k_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v_cache, v_ref, rtol=1e-5, atol=1e-6)
    assert not torch.equal(k_cache, k0)  # the step's K rows were written


def test_bf16_weights_are_a_rounding_of_the_float32_head(targets: dict[str, Any]) -> None:
    """``draft_dtype`` bfloat16 keeps the head's matrices in bf16 (the values of the float32 head, rounded),
    the activations, norms and KV in float32."""
    f32, bf = _proposer(targets, "eagle3", "float32"), _proposer(targets, "eagle3", "bfloat16")
    assert bf.head.dtype == torch.float32 and bf.kv_cache.k[0].dtype == torch.float32
    for name in ("fc", "qkv", "o_proj", "gate_up", "down"):
        w32, w16 = getattr(f32.head, name), getattr(bf.head, name)
        assert w16.dtype == torch.bfloat16 and torch.equal(w16, w32.to(torch.bfloat16)), name
    assert bf.head.post_norm.dtype == torch.float32
    assert bf.head.lm_head.dtype == torch.bfloat16  # the head's own draft LM head


@pytest.mark.parametrize("draft_dtype", ["float32", "bfloat16", "int8", "q8_0"])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_native_input_fusion_and_drafts_equal_the_heads(targets: dict[str, Any], method: str, draft_dtype: str) -> None:
    """EAGLE-3's input norms in one call, and the drafts' last steps (final norm, draft LM head, argmax, the
    draft -> target map) in one call, against the head's torch ops: inputs and logits to float32 rounding,
    every draft equal where the top two logits are apart (a near-tie may break either way, and a draft only
    proposes). The other methods' fusions are the head's own; their LM head may be the target's."""
    p = _proposer(targets, method, draft_dtype)
    native = p.native
    assert native is not None
    gen = torch.Generator().manual_seed(1)
    ids, feat = torch.randint(0, V, (5,), generator=gen), torch.randn(5, H, generator=gen)
    got, want = native.layer_input(ids, feat), p.head.layer_input(ids, feat)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert native.fast_inputs == (method == "eagle3")
    h = torch.randn(7, H, generator=gen) * 3
    ref_logits = p.head.logits(h).float()
    toks = native.draft_tokens(h)
    if native.fast_tokens:
        logits = torch.empty_like(ref_logits)
        assert torch.equal(native.kernel.head_tokens(h, p.head.norm, p.head.cfg.rms_norm_eps, p.head.lm_head,
                                                     p.head.draft_map, logits), toks)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        best = logits.argmax(dim=1)
        assert torch.equal(toks, best if p.head.draft_map is None else p.head.draft_map[best])
    top2 = ref_logits.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3
    assert clear.sum() >= 5
    assert torch.equal(toks[clear], p.head.draft_tokens(h)[clear])
    # A tree level's candidates: the top 3 draft ids and their log-probabilities, against log_softmax + topk.
    got = native.top_k(h, 3)
    assert (got is None) == (not native.fast_tokens)
    if got is not None:
        want = torch.log_softmax(ref_logits, dim=-1).topk(3, dim=-1)
        torch.testing.assert_close(got[0], want.values, rtol=1e-4, atol=1e-4)
        top4 = ref_logits.topk(4, dim=1).values
        apart = ((top4[:, :-1] - top4[:, 1:]) > 1e-3).all(dim=1)
        assert apart.sum() >= 4 and torch.equal(got[1][apart], want.indices[apart])


def test_native_head_tokens_checks_its_inputs(targets: dict[str, Any]) -> None:
    p = _proposer(targets, "eagle3", "int8")
    assert p.native is not None and p.native.fast_tokens and p.native.fast_inputs
    kernel, head = p.native.kernel, p.head
    with pytest.raises(ValueError, match="h is"):
        kernel.head_tokens(torch.randn(2, H, dtype=torch.bfloat16), head.norm, 1e-5, head.lm_head, head.draft_map)
    with pytest.raises(ValueError, match="rows"):
        kernel.head_tokens(torch.randn(65, H), head.norm, 1e-5, head.lm_head, head.draft_map)
    with pytest.raises(ValueError, match="draft_map"):
        kernel.head_tokens(torch.randn(2, H), head.norm, 1e-5, head.lm_head, head.draft_map[:3])
    # Equal logits (a zero row): the lower draft ids first, each at -log(vd).
    vd = head.lm_head.shape[0]
    lp, ids = kernel.head_top_k(torch.zeros(1, H), head.norm, 1e-5, head.lm_head, 3)
    assert ids.tolist() == [[0, 1, 2]] and torch.allclose(lp, torch.full((1, 3), -math.log(vd)))
    with pytest.raises(ValueError, match="top 0"):
        kernel.head_top_k(torch.zeros(1, H), head.norm, 1e-5, head.lm_head, 0)
    with pytest.raises(ValueError, match="wb"):
        kernel.head_rms_pair(torch.randn(2, H), torch.randn(2, H), torch.ones(H), torch.ones(H - 1), 1e-5)


def test_prefill_rows_take_the_torch_layer(targets: dict[str, Any]) -> None:
    p = _proposer(targets, "eagle", "bfloat16")
    assert p.native is not None
    batch = build_forward_batch([PagedRequest(list(range(1, 41)), 0, [0, 1, 2])], BS)  # a 40-token chunk
    meta = p.backend.build_metadata(batch, BS)
    feat = torch.randn(batch.num_tokens, H)
    residual, attn_in = p.head.layer_input(batch.input_ids, feat)
    assert p.native(residual, attn_in, batch.positions, meta) is None  # a long query: not the native layer
    out = p._head(batch.input_ids, feat, batch.positions, meta)
    assert out.shape == (40, H) and torch.isfinite(out).all()


def test_head_layer_checks_its_inputs(targets: dict[str, Any]) -> None:
    p = _proposer(targets, "eagle3", "float32")
    assert p.native is not None
    batch = build_forward_batch([PagedRequest([3], 4, [0])], BS)
    meta = p.backend.build_metadata(batch, BS)
    residual, attn_in = p.head.layer_input(batch.input_ids, torch.randn(1, H))
    with pytest.raises(ValueError, match="attn_in"):
        p.native(residual, attn_in[:, :H], batch.positions, meta)  # eagle3's input is 2H wide


def test_draft_dtype_validation(targets: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="draft_dtype 'float16'"):
        _proposer(targets, "eagle", "float16")
    with pytest.raises(ValueError, match="'int8'.*eagle, eagle3 and mtp"):
        SpeculativeConfig(method="draft_model", num_speculative_tokens=3, model="x", draft_dtype="int8")
    with pytest.raises(ValueError, match="draft_dtype must be one of"):
        SpeculativeConfig(method="eagle", num_speculative_tokens=3, draft_dtype="int4")
    auto = _proposer(targets, "mtp", "auto")
    assert auto.head.weight_dtype == torch.int8  # the CPU default under a float32 target (fc in bf16)
    assert auto.head.fc.dtype == torch.bfloat16
    # MTP shares the target's LM head: it stays the target's tensor (float32), whatever the weights.
    assert auto.head.lm_head.dtype == torch.float32


def test_int8_weights_quantize_the_layer_and_keep_the_fusion_in_bf16(targets: dict[str, Any]) -> None:
    """``draft_dtype`` int8: the decoder layer's matrices (and the head's own LM head) are int8 with a scale
    per output feature, each within half a step of the float32 head's; ``fc`` stays bf16 (rounding the
    input fusion costs acceptance: see head.INT8_MATRICES); activations, norms and the KV stay float32."""
    from tandem.model.quant import Int8Weight
    from tandem.spec_decode.head import INT8_MATRICES

    f32, q8 = _proposer(targets, "eagle3", "float32"), _proposer(targets, "eagle3", "int8")
    assert q8.head.dtype == torch.float32 and q8.kv_cache.k[0].dtype == torch.float32
    assert INT8_MATRICES == {"qkv", "o_proj", "gate_up", "down"}
    for name in ("qkv", "o_proj", "gate_up", "down"):
        w32, w8 = getattr(f32.head, name), getattr(q8.head, name)
        assert isinstance(w8, Int8Weight) and w8.q.dtype == torch.int8, name
        step = w8.scale.unsqueeze(1)
        assert ((w8.dequantize() - w32.float()).abs() <= step / 2 + 1e-6).all(), name
    assert q8.head.fc.dtype == torch.bfloat16 and torch.equal(q8.head.fc, f32.head.fc.to(torch.bfloat16))
    assert isinstance(q8.head.lm_head, Int8Weight)  # eagle3's own draft LM head
    with pytest.raises(ValueError, match="inference"):
        q8.head.canonical_tensors()
    # MTP shares the target's LM head: the same float32 tensor, never quantized.
    mtp = _proposer(targets, "mtp", "int8")
    assert isinstance(mtp.head.lm_head, torch.Tensor) and mtp.head.lm_head.dtype == torch.float32
    # An int8 head drafts: three proposals from a verify step's rows, through the native layer.
    batch = build_forward_batch([PagedRequest([7, 8, 9, 10], 20, [0, 1])], BS)
    batch.attn_metadata = q8.backend.build_metadata(batch, BS)
    h = q8._head(batch.input_ids, torch.randn(4, H), batch.positions, batch.attn_metadata)
    assert torch.isfinite(h).all() and q8.head.draft_tokens(h).shape == (4,)


def test_q8_0_puts_the_layer_in_gguf_blocks(targets: dict[str, Any]) -> None:
    """``draft_dtype`` q8_0: the decoder layer's matrices (and the head's own LM head) in interleaved Q8_0
    blocks, each weight within half a step of its block's scale of the float32 head's; a matrix whose input
    width is not a multiple of 32 (the tiny head's down projection, 48 wide) stays per-feature int8; ``fc``
    in blocks too. ``auto`` under a target without blocks stays per-feature int8."""
    from gguf.quants import dequantize, quantize

    from tandem.model.block_quant import BlockQuantWeight
    from tandem.model.quant import Int8Weight

    f32, q8 = _proposer(targets, "eagle3", "float32"), _proposer(targets, "eagle3", "q8_0")
    for name in ("qkv", "o_proj", "gate_up", "fc"):
        w32, wq = getattr(f32.head, name), getattr(q8.head, name)
        assert isinstance(wq, BlockQuantWeight) and wq.layouts == ("Q8_0x16",), name
        want = dequantize(quantize(w32.float().numpy(), wq.parts[0].qtype), wq.parts[0].qtype)
        assert torch.equal(wq.dequantize(), torch.from_numpy(want)), name  # gguf-py's rounding, bit for bit
    assert isinstance(q8.head.down, Int8Weight)
    assert isinstance(q8.head.lm_head, BlockQuantWeight) and isinstance(q8.head.fc, BlockQuantWeight)
    assert q8.native is not None and q8.native.fast_tokens
    auto = _proposer(targets, "eagle3", "auto")
    assert isinstance(auto.head.qkv, Int8Weight) and isinstance(auto.head.lm_head, Int8Weight)
