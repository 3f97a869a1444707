"""Dequantization of GGUF tensors, through gguf-py (``gguf.quants.dequantize``, the maintained reference).

Every GGML storage type stores each row of a tensor as a run of fixed-size blocks (one element per block
for ``F32`` / ``F16`` / ``BF16``; 32 or 256 weights with their scales for the quantized types). Tensors that
stay in their blocks (``quantization="gguf"``, model/block_quant.py) never come here; everything else —
the norms, any tensor under ``quantization="none"``, a quantized type without a native kernel — is
dequantized to float32 here, and every type gguf-py can decode is accepted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

QType = GGMLQuantizationType


class UnsupportedQuantError(ValueError):
    """A GGUF tensor is stored in a type tandem cannot dequantize."""


def type_name(qtype: int) -> str:
    try:
        return QType(qtype).name
    except ValueError:
        return f"unknown type {qtype}"


def storage_nbytes(qtype: int, shape: Sequence[int], name: str) -> int:
    """Bytes a tensor of ``shape`` (row-major) occupies in ``qtype``; raises if the type is unknown or the
    rows do not split into whole blocks (before any weight is read)."""
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
    """Decode the bytes ``raw`` of tensor ``name`` into a fresh float32 CPU tensor of ``shape``
    (row-major: Hugging Face order, i.e. GGUF's dimension list reversed)."""
    expected = storage_nbytes(qtype, shape, name)
    flat = np.asarray(raw).reshape(-1).view(np.uint8)
    if flat.size != expected:
        raise ValueError(
            f"tensor {name!r}: {flat.size} bytes of {type_name(qtype)} data, expected {expected} "
            f"for shape {tuple(shape)}"
        )
    try:
        with np.errstate(invalid="ignore", over="ignore"):  # arbitrary scales (inf * 0) are the file's
            values = gguf_dequantize(flat, QType(qtype))
    except NotImplementedError as exc:
        raise UnsupportedQuantError(
            f"tensor {name!r} is stored as {type_name(qtype)}, which gguf-py cannot dequantize"
        ) from exc
    out = np.array(values, dtype=np.float32, copy=True).reshape(tuple(shape))  # never the file's memory
    return torch.from_numpy(out)
