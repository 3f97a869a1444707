"""The interleaved layout of Q4_0 / Q4_1 / Q8_0 rows (model/block_repack.py): an exact inverse pair, the
field positions its docstring states, and the row operations of BlockQuantWeight across it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf.quants import dequantize

from tandem.model import block_repack
from tandem.model.block_quant import QDESC_INTERLEAVED, BlockQuantWeight
from tests.quant_blocks import Q, random_blocks

TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_repack_and_unpack_are_inverse_and_keep_the_bytes(qtype: Q) -> None:
    raw = random_blocks(qtype, 48, 96, np.random.default_rng(int(qtype)))
    packed = block_repack.repack(raw, qtype)
    assert packed.shape == raw.shape and packed.dtype == np.uint8
    assert not np.array_equal(packed, raw)
    assert np.array_equal(block_repack.unpack(packed, qtype), raw)
    local = np.array([47, 0, 16, 16, 31])
    assert np.array_equal(block_repack.unpack_rows(packed, qtype, local), raw[local])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_fields_sit_where_the_docstring_says(qtype: Q) -> None:
    """Row o's scale at bytes 2o of the group-block, its weight 8c + s in bits 4s of lane o of chunk c (Q4)
    or in byte t of lane o of chunk j for weight 4j + t (Q8_0)."""
    raw = random_blocks(qtype, 16, 64, np.random.default_rng(1))  # 16 rows, 2 blocks
    packed = block_repack.repack(raw, qtype).reshape(-1)
    bytes_per_block = raw.shape[1] // 2
    hdr = 2 if qtype != Q.Q4_1 else 4
    for o in (0, 5, 15):
        for b in (0, 1):
            blk = raw[o, b * bytes_per_block : (b + 1) * bytes_per_block]
            group = packed[b * 16 * bytes_per_block : (b + 1) * 16 * bytes_per_block]
            assert bytes(group[2 * o : 2 * o + 2]) == bytes(blk[0:2])  # d
            if qtype == Q.Q4_1:
                assert bytes(group[32 + 2 * o : 34 + 2 * o]) == bytes(blk[2:4])  # m
            body = group[16 * hdr :]
            for i in (0, 7, 8, 17, 31):
                if qtype == Q.Q8_0:
                    j, t = divmod(i, 4)
                    assert body[64 * j + 4 * o + t] == blk[2 + i]
                    continue
                want = (blk[hdr + i] & 15) if i < 16 else (blk[hdr + i - 16] >> 4)
                c, s = divmod(i, 8)
                lane = int.from_bytes(bytes(body[64 * c + 4 * o : 64 * c + 4 * o + 4]), "little")
                assert (lane >> (4 * s)) & 15 == want


def test_weights_repack_whole_groups_and_row_operations_see_ggml_rows() -> None:
    rng = np.random.default_rng(2)
    a = BlockQuantWeight.from_raw(random_blocks(Q.Q4_1, 37, 64, rng), Q.Q4_1, (37, 64), "a")
    b = BlockQuantWeight.from_raw(random_blocks(Q.Q5_0, 16, 64, rng), Q.Q5_0, (16, 64), "b")
    w = BlockQuantWeight.stack([a, b], "ab").with_gain(torch.rand(64) + 0.5)
    r = w.repacked()
    # 32 rows interleaved, a remainder of 5; Q5_0 widened to Q8_0 (12 more bytes a block), interleaved
    assert r.layouts == ("Q4_1x16", "Q4_1", "Q8_0x16")
    assert r.nbytes == w.nbytes + 16 * 2 * 12 and r.shape == w.shape
    assert torch.equal(r.dequantize(), w.dequantize())
    idx = [52, 3, 33, 3, 17]
    sub = r.take_rows(idx)
    assert torch.equal(sub.dequantize(), w.dequantize()[idx])
    assert torch.equal(BlockQuantWeight.stack([a.repacked(), b], "s").dequantize(),
                       BlockQuantWeight.stack([a, b], "s").dequantize())
    types = r.descriptor[4::4].tolist()
    assert types == [int(Q.Q4_1) | QDESC_INTERLEAVED, int(Q.Q4_1), int(Q.Q8_0) | QDESC_INTERLEAVED]
    with pytest.raises(ValueError, match="Q5_0"):
        block_repack.repack(b.parts[0].data.numpy(), Q.Q5_0)


@pytest.mark.parametrize("rows", [16, 21])
def test_q5_0_widens_to_the_same_weights_as_q8_0(rows: int) -> None:
    """Every 5-bit value (both nibbles, every fifth bit) comes out as the same float through gguf-py; a
    remainder of rows stays Q5_0."""
    rng = np.random.default_rng(5)
    raw = random_blocks(Q.Q5_0, rows, 128, rng)
    wide = block_repack.widen_q5_0(raw)
    assert wide.shape == (rows, 4 * 34)
    assert np.array_equal(dequantize(wide, Q.Q8_0), dequantize(raw, Q.Q5_0))
    w = BlockQuantWeight.from_raw(raw, Q.Q5_0, (rows, 128), "w").repacked()
    assert w.layouts == (("Q8_0x16",) if rows == 16 else ("Q8_0x16", "Q5_0"))
    assert torch.equal(w.dequantize(), BlockQuantWeight.from_raw(raw, Q.Q5_0, (rows, 128), "w").dequantize())
