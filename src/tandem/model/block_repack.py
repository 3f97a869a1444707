"""The interleaved layout of Q4_0 / Q4_1 / Q8_0 rows that the native few-row products stream
(``native/quant_r16.h``): 16 rows at a time, the same bytes per weight as GGML's blocks.

GGML stores a matrix row by row, each row a sequence of 32-weight blocks (a float16 scale ``d``, Q4_1's
float16 offset ``m``, then the quantized weights). A few-row product on that layout converts one block's
scale and its 32 weights for every output feature, one feature at a time: ~20 vector instructions per
32 weights, which made the product instruction-bound at about a quarter of the machine's read bandwidth
(BENCHMARKS.md §13). Interleaved, the blocks of 16 consecutive rows at one block index lie together, and
every field is laid out so that one vector register holds the same field of all 16 rows:

==========  =================================================================================================
``Q4_0``    ``d[16]`` (float16), then 4 chunks of 64 bytes: chunk ``c``'s 32-bit lane ``o`` holds row ``o``'s
            weights ``8c .. 8c + 7`` of the block, weight ``8c + s`` in bits ``4s .. 4s + 3`` (288 bytes)
``Q4_1``    ``d[16]``, ``m[16]`` (float16), then the same 4 chunks (320 bytes)
``Q8_0``    ``d[16]``, then 8 chunks of 64 bytes: chunk ``j``'s lane ``o`` holds row ``o``'s weights
            ``4j .. 4j + 3`` as int8, weight ``4j + t`` in byte ``t`` (544 bytes)
==========  =================================================================================================

so a group of 16 rows at one block index is 16 x the block's bytes, and a group's blocks follow each other
(one sequential stream per group). The float32 product then costs one mask (or shift) and one conversion
per 16 weights and one FMA per 16 weights and row (native/quant_r16.h); with int8 activations one VNNI
instruction multiplies 4 weights of all 16 rows (native/quant_r16_i8.h). The data keeps the ``[rows, row bytes]`` shape of its
part; only the byte order inside each group changes. :func:`repack` and :func:`unpack` are exact inverses
(tested), and every reference computation (gguf-py's dequantization, row selection) runs on the unpacked
GGML bytes.
"""

from __future__ import annotations

import mmap
import threading

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
GROUP = 16  # rows interleaved together
# type -> bytes of the float16 header (d, or d and m) of one block
_HEADER = {Q.Q4_0: 2, Q.Q4_1: 4, Q.Q8_0: 2}
REPACK_TYPES = frozenset(_HEADER)


class _Arena:
    """Where interleaved parts live: anonymous memory mapped in 64 MiB chunks that the kernel is asked to back
    with 2 MiB pages (``MADV_HUGEPAGE``: transparent huge pages are ``madvise`` on these machines), parts
    placed at 64-byte boundaries. A decode step streams every matrix once: with 4 KiB pages that is ~25,000
    TLB misses a step for SmolLM2's 97 MB, and a part that starts off a cache line splits every 64-byte load
    (torch tensors made from numpy arrays start at 16-byte boundaries). A chunk stays mapped while any part
    in it is alive (the tensors hold the mapping)."""

    CHUNK = 64 << 20
    ALIGN = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunk: mmap.mmap | None = None
        self._used = 0

    def empty(self, nbytes: int) -> torch.Tensor:
        """An uninitialised uint8 tensor of ``nbytes``, 64-byte aligned."""
        with self._lock:
            if self._chunk is None or self._used + nbytes > len(self._chunk):
                # Private: a shared anonymous mapping is shmem, whose huge pages follow ``shmem_enabled``
                # (``never`` on these machines), so it got none.
                self._chunk = mmap.mmap(-1, max(self.CHUNK, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE),
                                        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                if hasattr(mmap, "MADV_HUGEPAGE"):
                    self._chunk.madvise(mmap.MADV_HUGEPAGE)
                self._used = 0
            start = self._used
            self._used = -(-(start + nbytes) // self.ALIGN) * self.ALIGN
            return torch.frombuffer(self._chunk, dtype=torch.uint8, count=nbytes, offset=start)


_ARENA = _Arena()


def aligned_copy(data: np.ndarray) -> torch.Tensor:
    """``data`` (uint8, 2-D) copied into the arena: same shape, 64-byte aligned, on huge pages where the
    kernel grants them."""
    out = _ARENA.empty(data.size).view(data.shape)
    out.copy_(torch.from_numpy(np.ascontiguousarray(data)))
    return out


def widen_q5_0(data: np.ndarray) -> np.ndarray:
    """Q5_0 rows ``[rows, row bytes]`` uint8 -> the same weights as Q8_0 rows, exactly: a Q5_0 weight is
    ``d * (q - 16)`` with a 5-bit ``q`` (low nibble in ``qs``, fifth bit in ``qh``), which is the int8
    ``q - 16`` times the same float16 ``d``. There is no interleaved Q5_0 kernel; widened, Q5_0 matrices take
    the interleaved Q8_0 one, at 34 bytes a block instead of 22."""
    rows, rb = data.shape
    block_bytes = GGML_QUANT_SIZES[Q.Q5_0][1]
    nb = rb // block_bytes
    blocks = data.reshape(rows, nb, block_bytes)
    qh = blocks[..., 2:6].copy().view("<u4")  # [rows, nb, 1]: bit j is weight j's fifth bit
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [rows, nb, 32]
    qs = blocks[..., 6:]
    low = np.concatenate([qs & 15, qs >> 4], axis=-1)  # weight j < 16 in byte j's low nibble, j >= 16 high
    q = ((low | (high << 4)).astype(np.int16) - 16).astype(np.int8).view(np.uint8)
    out = np.concatenate([blocks[..., :2], q], axis=-1)  # d, then 32 int8
    return np.ascontiguousarray(out.reshape(rows, nb * GGML_QUANT_SIZES[Q.Q8_0][1]))


def can_repack(qtype: int, rows: int) -> bool:
    """Whether a part of ``rows`` rows of ``qtype`` takes the interleaved layout (a whole number of groups)."""
    return qtype in _HEADER and rows > 0 and rows % GROUP == 0


def _blocks(data: np.ndarray, qtype: int) -> tuple[np.ndarray, int, int]:
    block_bytes = GGML_QUANT_SIZES[Q(qtype)][1]
    rows, rb = data.shape
    nb = rb // block_bytes
    return data.reshape(rows // GROUP, GROUP, nb, block_bytes), nb, block_bytes


def repack(data: np.ndarray, qtype: int) -> np.ndarray:
    """GGML rows ``[rows, row bytes]`` uint8 -> the interleaved layout, same shape."""
    if not can_repack(qtype, data.shape[0]):
        raise ValueError(f"repack: {Q(qtype).name} x {data.shape[0]} rows has no interleaved layout")
    blocks, nb, block_bytes = _blocks(data, qtype)
    g = blocks.shape[0]
    blocks = blocks.transpose(0, 2, 1, 3)  # [groups, nb, 16 rows, block bytes]
    h = _HEADER[Q(qtype)]
    fields = [blocks[..., f : f + 2].reshape(g, nb, 2 * GROUP) for f in range(0, h, 2)]  # d[16], m[16]
    body = blocks[..., h:]
    if qtype == Q.Q8_0:
        packed = body.reshape(g, nb, GROUP, 8, 4).transpose(0, 1, 3, 2, 4).reshape(g, nb, 32 * GROUP)  # j, o, t
    else:
        q = np.concatenate([body & 15, body >> 4], axis=-1)  # [.., o, 32]: element l low, l + 16 high nibble
        q = q.reshape(g, nb, GROUP, 4, 4, 2)  # o, chunk c, byte t, pair
        packed = (q[..., 0] | (q[..., 1] << 4)).transpose(0, 1, 3, 2, 4).reshape(g, nb, 16 * GROUP)
    out = np.concatenate([*fields, packed], axis=-1)
    return np.ascontiguousarray(out.reshape(data.shape))


def unpack(data: np.ndarray, qtype: int) -> np.ndarray:
    """The interleaved layout ``[rows, row bytes]`` -> GGML rows, same shape (:func:`repack`'s inverse)."""
    rows, rb = data.shape
    block_bytes = GGML_QUANT_SIZES[Q(qtype)][1]
    nb, g, h = rb // block_bytes, rows // GROUP, _HEADER[Q(qtype)]
    flat = data.reshape(g, nb, GROUP * block_bytes)
    fields = [flat[..., f * GROUP : (f + 2) * GROUP].reshape(g, nb, GROUP, 2) for f in range(0, h, 2)]
    body = flat[..., h * GROUP :]
    if qtype == Q.Q8_0:
        q = body.reshape(g, nb, 8, GROUP, 4).transpose(0, 1, 3, 2, 4).reshape(g, nb, GROUP, 32)
    else:
        packed = body.reshape(g, nb, 4, GROUP, 4).transpose(0, 1, 3, 2, 4)  # o, c, t
        pairs = np.stack([packed & 15, packed >> 4], axis=-1).reshape(g, nb, GROUP, 32)  # element 8c + 2t + k
        q = pairs[..., :16] | (pairs[..., 16:] << 4)
    blocks = np.concatenate([*fields, q], axis=-1)  # [g, nb, 16, block bytes]
    return np.ascontiguousarray(blocks.transpose(0, 2, 1, 3).reshape(rows, rb))


def unpack_rows(data: np.ndarray, qtype: int, local: np.ndarray) -> np.ndarray:
    """GGML rows ``local`` of an interleaved part, unpacking only the groups they fall in."""
    groups = np.unique(local // GROUP)
    rb = data.shape[1]
    plain = unpack(data.reshape(-1, GROUP, rb)[groups].reshape(-1, rb), qtype)
    where = np.searchsorted(groups, local // GROUP) * GROUP + local % GROUP
    return plain[where]
