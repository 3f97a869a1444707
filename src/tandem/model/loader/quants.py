"""Dequantizers for the GGML storage types tandem reads from GGUF files.

Every supported type stores each row of a tensor as a run of fixed-size blocks:

- ``F32`` / ``F16`` / ``BF16``: one element per block, the plain little-endian value.
- ``Q8_0``: 34 bytes per 32 weights: an fp16 scale ``d``, then 32 int8 ``q``; weight = ``q * d``.
- ``Q4_0``: 18 bytes per 32 weights: fp16 ``d``, then 16 bytes of nibbles; weight = ``(q - 8) * d``.
- ``Q4_1``: 20 bytes per 32 weights: fp16 ``d``, fp16 ``m``, 16 bytes of nibbles;
  weight = ``q * d + m``.

In the 4-bit types byte ``j`` of the nibble run holds element ``j`` in its low nibble and element
``j + 16`` in its high nibble. The arithmetic is done in float32 in the same order as the reference
(``gguf.quants``) so the results agree bit for bit. It is vectorised numpy with in-place updates
rather than torch: the default 135M-parameter model decodes in about 0.5 s either way, but torch's
many small multi-threaded ops slowed to 5-15 s when the CPUs were shared with other processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

QType = GGMLQuantizationType


class UnsupportedQuantError(ValueError):
    """A GGUF tensor is stored in a type tandem cannot dequantize."""


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 field at byte ``start`` of every block, as a float32 column ``[n, 1]``."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """Unpack ``[n, 16]`` bytes into float32 ``[n, 32]``: low nibbles first, then high nibbles."""
    out = np.empty((packed.shape[0], 32), dtype=np.float32)
    np.bitwise_and(packed, 0x0F, out=out[:, :16], casting="unsafe")
    np.right_shift(packed, 4, out=out[:, 16:], casting="unsafe")
    return out


def _f32(blocks: np.ndarray) -> np.ndarray:
    return blocks.copy().view(np.float32)


def _f16(blocks: np.ndarray) -> np.ndarray:
    return blocks.copy().view(np.float16).astype(np.float32)


def _bf16(blocks: np.ndarray) -> np.ndarray:
    # bfloat16 is the top half of a float32.
    return np.left_shift(blocks.copy().view(np.uint16).astype(np.uint32), 16).view(np.float32)


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    q *= _half(blocks, 0)
    return q


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 2:])
    q -= 8.0
    q *= _half(blocks, 0)
    return q


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 4:])
    q *= _half(blocks, 0)
    q += _half(blocks, 2)
    return q


# type -> (weights per block, bytes per block, decoder returning [n_blocks, weights per block])
_DECODERS: dict[int, tuple[int, int, Callable[[np.ndarray], np.ndarray]]] = {
    QType.F32: (1, 4, _f32),
    QType.F16: (1, 2, _f16),
    QType.BF16: (1, 2, _bf16),
    QType.Q8_0: (32, 34, _q8_0),
    QType.Q4_0: (32, 18, _q4_0),
    QType.Q4_1: (32, 20, _q4_1),
}

SUPPORTED_TYPES = frozenset(QType(t) for t in _DECODERS)


def type_name(qtype: int) -> str:
    try:
        return QType(qtype).name
    except ValueError:
        return f"unknown type {qtype}"


def storage_nbytes(qtype: int, shape: Sequence[int], name: str) -> int:
    """Bytes a tensor of ``shape`` (row-major) occupies in ``qtype``; raises if the rows do not
    split into whole blocks. Unsupported but known types are sized too, so a file can be indexed
    and the error deferred to the moment that tensor is actually dequantized."""
    if qtype not in GGML_QUANT_SIZES:
        raise UnsupportedQuantError(f"tensor {name!r}: unknown GGML type id {qtype}")
    block, nbytes = GGML_QUANT_SIZES[QType(qtype)]
    row = shape[-1] if shape else 1
    if row % block:
        raise ValueError(
            f"tensor {name!r}: row length {row} is not a multiple of the {type_name(qtype)} "
            f"block size {block}"
        )
    return math.prod(shape) // block * nbytes


def dequantize(raw: np.ndarray, qtype: int, shape: Sequence[int], name: str) -> torch.Tensor:
    """Decode the bytes ``raw`` of tensor ``name`` into a float32 CPU tensor of ``shape``.

    ``shape`` is row-major (Hugging Face order, i.e. GGUF's dimension list reversed).
    """
    entry = _DECODERS.get(qtype)
    if entry is None:
        supported = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
        raise UnsupportedQuantError(
            f"tensor {name!r} is stored as {type_name(qtype)}, which tandem cannot dequantize "
            f"(supported: {supported})"
        )
    _, block_bytes, decode = entry
    expected = storage_nbytes(qtype, shape, name)
    flat = np.asarray(raw).reshape(-1).view(np.uint8)
    if flat.size != expected:
        raise ValueError(
            f"tensor {name!r}: {flat.size} bytes of {type_name(qtype)} data, expected {expected} "
            f"for shape {tuple(shape)}"
        )
    # Every decoder returns a fresh writable array, so the (read-only) memory map is never
    # handed to torch.
    return torch.from_numpy(decode(flat.reshape(-1, block_bytes)).reshape(tuple(shape)))
