"""Dequantization at load (``tandem.model.loader.quants``: gguf-py's ``gguf.quants.dequantize`` behind
tandem's checks): fresh float32 tensors, GGML's layouts, errors that name the tensor and the type."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from tandem.model.loader.quants import UnsupportedQuantError, dequantize, storage_nbytes

Q = GGMLQuantizationType
BLOCK_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q2_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.BF16, Q.F16, Q.F32]


def _random_bytes(qtype: Q, rows: int, cols: int, seed: int) -> np.ndarray:
    block, nbytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(rows, cols // block * nbytes), dtype=np.uint8)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_random_bytes_decode_bit_identical(qtype: Q) -> None:
    # Arbitrary bytes cover every nibble/int8 value and also NaN/inf scales; the two decoders
    # must agree bit for bit (NaN where the reference has NaN).
    raw = _random_bytes(qtype, rows=8, cols=256, seed=int(qtype))
    with np.errstate(invalid="ignore", over="ignore"):  # inf scale * 0 nibble = NaN, by design
        ref = quants.dequantize(raw, qtype).astype(np.float32).reshape(8, 256)
        got = dequantize(raw, qtype, (8, 256), "t")
    assert got.dtype == torch.float32 and got.shape == (8, 256)
    torch.testing.assert_close(got, torch.from_numpy(ref), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.BF16], ids=lambda q: q.name)
def test_quantized_weights_decode_like_reference(qtype: Q) -> None:
    rng = np.random.default_rng(1)
    weights = (rng.standard_normal((16, 96)) * 0.05).astype(np.float32)
    raw = quants.quantize(weights, qtype)
    ref = quants.dequantize(raw, qtype).astype(np.float32)
    got = dequantize(raw, qtype, (16, 96), "blk.0.attn_q.weight")
    assert torch.equal(got, torch.from_numpy(ref))
    # And it is a faithful decode: within one quantization step of the original.
    step = np.abs(weights).max() / (127 if qtype == Q.Q8_0 else 7)
    assert np.abs(got.numpy() - weights).max() <= step


def test_nibble_order_low_then_high() -> None:
    # One Q4_1 block with d = 1, m = 0 and byte j = (j | (15 - j) << 4): element j is j, element
    # j + 16 is 15 - j.
    block = np.zeros(20, dtype=np.uint8)
    block[0:2] = np.frombuffer(np.float16(1.0).tobytes(), dtype=np.uint8)
    block[4:] = [j | ((15 - j) << 4) for j in range(16)]
    got = dequantize(block, Q.Q4_1, (32,), "t").tolist()
    assert got == [float(j) for j in range(16)] + [float(15 - j) for j in range(16)]


def test_decoded_tensor_is_fresh_and_writable() -> None:
    raw = _random_bytes(Q.Q4_K, rows=2, cols=256, seed=0)
    raw.setflags(write=False)  # like the file's memory map
    with np.errstate(invalid="ignore", over="ignore"):
        got = dequantize(raw, Q.Q4_K, (2, 256), "blk.3.ffn_up.weight")
    got.add_(1.0)  # never the file's memory
    assert got.shape == (2, 256) and got.dtype == torch.float32


def test_wrong_byte_count_and_ragged_rows_raise() -> None:
    raw = _random_bytes(Q.Q8_0, rows=2, cols=64, seed=0)
    with pytest.raises(ValueError, match="output.weight.*bytes"):
        dequantize(raw, Q.Q8_0, (3, 64), "output.weight")
    with pytest.raises(ValueError, match="token_embd.weight.*multiple of"):
        storage_nbytes(Q.Q8_0, (4, 40), "token_embd.weight")
    with pytest.raises(UnsupportedQuantError, match="x.weight.*9999"):
        storage_nbytes(9999, (4, 32), "x.weight")
