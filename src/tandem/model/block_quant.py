"""GGUF block-quantized matrices kept in their blocks (``quantization="gguf"``).

A :class:`BlockQuantWeight` is a ``[out, in]`` matrix whose rows are stored as GGML blocks (Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; F16 / BF16 / F32 rows too), possibly in several *parts* of different
types stacked by rows (a fused ``qkv`` whose q, k and v were stored in different types), with an optional
``gain`` on the input columns: ``y = (x * gain) @ W^T``. The gain is the RMSNorm gain that float32 weights
have multiplied into their columns (weights.py); blocks cannot absorb it, so it stays a vector.

Row operations (a permutation of q/k rows, a vocabulary subset for a draft head, stacking parts) move
whole rows of bytes and never requantize. Once a matrix is assembled, :meth:`BlockQuantWeight.repacked` puts
its Q4_0 / Q4_1 / Q8_0 parts into the interleaved layout the few-row kernels stream (block_repack.py: 16 rows
at a time, the same bytes); row operations and the reference see GGML's layout again through
:meth:`BlockPart.plain`. Products run in the native kernels (``native/quant.h``:
the ``native`` linear kernels and the native decoder stack); :meth:`BlockQuantWeight.dequantize` is the reference, via
gguf-py's ``gguf.quants.dequantize``, and what the torch reference path multiplies with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from tandem.model import block_repack
from tandem.model.quant import Int8Weight

QType = GGMLQuantizationType
# Types the native kernels compute on (native/quant.h); any other GGUF type is dequantized at load.
KERNEL_TYPES = frozenset(
    QType(t)
    for t in (
        QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q4_K, QType.Q5_K, QType.Q6_K,
    )
)  # fmt: skip
# Types that are plain floats (kept dequantized: there is nothing to save by keeping them).
FLOAT_TYPES = frozenset((QType.F32, QType.F16, QType.BF16))
QDESC_HEAD, QDESC_PART = 4, 4  # quant.h's descriptor layout
QDESC_INTERLEAVED = 0x100  # quant.h: a part type with this flag is in block_repack's interleaved layout
# quant.h: an interleaved part's product on int8 activations, one or two levels (native/quant_r16_i8.h)
ACTIVATION_FLAGS = {"float32": 0, "int8": 0x200, "int8x2": 0x400}


def type_name(qtype: int) -> str:
    try:
        return QType(qtype).name
    except ValueError:
        return f"unknown type {qtype}"


def row_bytes(qtype: int, in_features: int, name: str = "tensor") -> int:
    """Bytes of one row of ``in_features`` weights; ``ValueError`` naming the tensor and type when the row
    does not split into whole blocks or the type is unknown."""
    if qtype not in GGML_QUANT_SIZES:
        raise ValueError(f"tensor {name!r}: unknown GGML type id {qtype}")
    block, nbytes = GGML_QUANT_SIZES[QType(qtype)]
    if in_features % block:
        raise ValueError(
            f"tensor {name!r}: row length {in_features} is not a multiple of the {type_name(qtype)} "
            f"block size {block}"
        )
    return in_features // block * nbytes


@dataclass(frozen=True, eq=False)
class BlockPart:
    qtype: int
    data: torch.Tensor  # uint8 [rows, row_bytes], contiguous
    interleaved: bool = False  # block_repack's layout (16 rows at a time), else GGML's rows

    @cached_property
    def rows(self) -> int:
        return int(self.data.shape[0])

    def plain(self) -> torch.Tensor:
        """The rows in GGML's layout (the data itself, or unpacked from the interleaved layout)."""
        if not self.interleaved:
            return self.data
        return torch.from_numpy(block_repack.unpack(self.data.numpy(), self.qtype))

    def plain_rows(self, local: torch.Tensor) -> torch.Tensor:
        """Rows ``local`` in GGML's layout (unpacking only the groups they fall in)."""
        if not self.interleaved:
            return self.data.index_select(0, local)
        return torch.from_numpy(block_repack.unpack_rows(self.data.numpy(), self.qtype, local.numpy()))


@dataclass(frozen=True, eq=False)
class BlockQuantWeight:
    parts: tuple[BlockPart, ...]
    in_features: int
    gain: torch.Tensor | None = None  # [in] float32 or None
    name: str = field(default="", compare=False)
    # what the interleaved parts' products quantize the activations to (ACTIVATION_FLAGS); other parts and
    # the reference always multiply float32 activations
    activations: str = "float32"

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"BlockQuantWeight {self.name!r}: no rows")
        for p in self.parts:
            want = row_bytes(p.qtype, self.in_features, self.name)
            if p.data.dtype != torch.uint8 or p.data.dim() != 2 or p.data.shape[1] != want:
                raise ValueError(
                    f"tensor {self.name!r}: {type_name(p.qtype)} rows of {self.in_features} weights take "
                    f"{want} bytes, got data {p.data.dtype} {tuple(p.data.shape)}"
                )
            if not p.data.is_contiguous():
                raise ValueError(f"tensor {self.name!r}: block data must be contiguous")
        if self.activations not in ACTIVATION_FLAGS:
            raise ValueError(f"tensor {self.name!r}: activations {self.activations!r}; one of {list(ACTIVATION_FLAGS)}")
        if self.gain is not None and (
            self.gain.dtype != torch.float32 or tuple(self.gain.shape) != (self.in_features,)
        ):
            raise ValueError(f"tensor {self.name!r}: gain must be float32 [{self.in_features}]")

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def from_raw(cls, raw: np.ndarray, qtype: int, shape: Sequence[int], name: str) -> BlockQuantWeight:
        """The stored bytes of a 2-D GGUF tensor (row-major ``shape`` [out, in]), copied out of the file."""
        if len(shape) != 2:
            raise ValueError(f"tensor {name!r}: a block-quantized matrix must be 2-D, got shape {tuple(shape)}")
        out, inp = int(shape[0]), int(shape[1])
        rb = row_bytes(qtype, inp, name)
        flat = np.asarray(raw).reshape(-1).view(np.uint8)
        if flat.size != out * rb:
            raise ValueError(
                f"tensor {name!r}: {flat.size} bytes of {type_name(qtype)} data, expected {out * rb} "
                f"for shape {(out, inp)}"
            )
        data = torch.from_numpy(flat.reshape(out, rb).copy())
        return cls((BlockPart(int(qtype), data),), inp, None, name)

    @classmethod
    def quantize_q8_0(cls, weight: torch.Tensor, name: str = "", activations: str = "float32") -> BlockQuantWeight:
        """A float matrix ``[out, in]`` (``in`` a multiple of 32) rounded to GGUF Q8_0 blocks by gguf-py
        (a scale per 32 weights), interleaved for the native kernels, multiplying ``activations``."""
        w = weight.detach().to("cpu", torch.float32).contiguous()
        if w.dim() != 2 or w.shape[1] % 32:
            raise ValueError(f"tensor {name!r}: Q8_0 takes [out, in] with in a multiple of 32, got {tuple(w.shape)}")
        raw = gguf_quantize(w.numpy(), GGMLQuantizationType.Q8_0)
        return cls.from_raw(raw, QType.Q8_0, tuple(w.shape), name).repacked().with_activations(activations)

    @staticmethod
    def stack(weights: Sequence[BlockQuantWeight], name: str = "") -> BlockQuantWeight:
        """The rows of ``weights`` one after another (no gain on any); adjacent parts of one type merge."""
        inp = weights[0].in_features
        parts: list[BlockPart] = []
        for w in weights:
            if w.in_features != inp or w.gain is not None:
                raise ValueError(f"stack {name!r}: matrices of {inp} inputs without gains")
            for p in w.parts:
                p = BlockPart(p.qtype, p.plain()) if p.interleaved else p
                if parts and parts[-1].qtype == p.qtype:
                    parts[-1] = BlockPart(p.qtype, torch.cat([parts[-1].data, p.data]))
                else:
                    parts.append(p)
        return BlockQuantWeight(tuple(parts), inp, None, name or weights[0].name)

    def with_gain(self, gain: torch.Tensor) -> BlockQuantWeight:
        g = gain.detach().to(torch.float32).contiguous()
        if self.gain is not None:
            g = (g * self.gain).contiguous()
        return replace(self, gain=g)

    def take_rows(self, index: torch.Tensor | Sequence[int]) -> BlockQuantWeight:
        """Rows ``index`` (any order, repeats allowed), keeping the gain; parts follow the rows' types. The
        result is interleaved where this matrix had interleaved parts (and its row counts allow it)."""
        idx = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.shape[0]):
            raise ValueError(f"tensor {self.name!r}: row index outside [0, {self.shape[0]})")
        starts = np.cumsum([0] + [p.rows for p in self.parts])
        which = np.searchsorted(starts, idx.numpy(), side="right") - 1
        parts: list[BlockPart] = []
        k = 0
        while k < len(which):  # runs of rows from one part keep their order
            j = k
            while j < len(which) and which[j] == which[k]:
                j += 1
            p = self.parts[which[k]]
            local = idx[k:j] - int(starts[which[k]])
            rows = p.plain_rows(local)
            if parts and parts[-1].qtype == p.qtype:
                parts[-1] = BlockPart(p.qtype, torch.cat([parts[-1].data, rows]))
            else:
                parts.append(BlockPart(p.qtype, rows.contiguous()))
            k = j
        out = BlockQuantWeight(tuple(parts), self.in_features, self.gain, self.name, self.activations)
        return out.repacked() if any(p.interleaved for p in self.parts) else out

    def repacked(self) -> BlockQuantWeight:
        """This matrix with its Q4_0 / Q4_1 / Q8_0 rows in the interleaved layout (block_repack.py), whole
        groups of 16 rows of each part (a remainder stays a GGML part after them), in the same bytes; Q5_0
        rows widened to Q8_0 first (exactly the same weights, 34 bytes a block instead of 22:
        :func:`block_repack.widen_q5_0`), since only the interleaved kernels stream at the machine's read
        bandwidth; other parts as they are."""
        parts = []
        for p in self.parts:
            whole = p.rows - p.rows % block_repack.GROUP
            qtype, data = p.qtype, p.data[:whole].numpy()
            if qtype == QType.Q5_0 and not p.interleaved and whole:
                qtype, data = QType.Q8_0, block_repack.widen_q5_0(data)
            if p.interleaved or not block_repack.can_repack(qtype, whole):
                parts.append(p)
                continue
            parts.append(BlockPart(qtype, block_repack.aligned_copy(block_repack.repack(data, qtype)), interleaved=True))
            if whole < p.rows:
                parts.append(BlockPart(p.qtype, p.data[whole:].contiguous()))
        return replace(self, parts=tuple(parts))

    def with_activations(self, activations: str) -> BlockQuantWeight:
        """The same matrix whose interleaved parts multiply ``activations`` (``"float32"``, ``"int8"``,
        ``"int8x2"``: native/quant_r16_i8.h)."""
        return replace(self, activations=activations)

    # -- what it is ------------------------------------------------------------------------------------
    @cached_property
    def shape(self) -> torch.Size:
        return torch.Size((sum(p.rows for p in self.parts), self.in_features))

    @cached_property
    def qtypes(self) -> frozenset[int]:
        return frozenset(p.qtype for p in self.parts)

    @cached_property
    def all_interleaved(self) -> bool:
        return all(p.interleaved for p in self.parts)

    @cached_property
    def device(self) -> torch.device:
        return self.parts[0].data.device

    @property
    def nbytes(self) -> int:
        """Resident bytes (blocks and gain)."""
        gain = 0 if self.gain is None else self.gain.numel() * 4
        return sum(p.data.numel() for p in self.parts) + gain

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(type_name(p.qtype) for p in self.parts)

    @property
    def layouts(self) -> tuple[str, ...]:
        """Each part's type and layout: ``Q4_1`` (GGML rows) or ``Q4_1x16`` (interleaved)."""
        return tuple(type_name(p.qtype) + ("x16" if p.interleaved else "") for p in self.parts)

    @cached_property
    def descriptor(self) -> torch.Tensor:
        """quant.h's int64 descriptor: [in, n_parts, gain address, out, (type, rows, row bytes, address)...].
        Holds addresses: the object keeps the tensors alive as long as the descriptor is used."""
        head = [self.in_features, len(self.parts), 0 if self.gain is None else self.gain.data_ptr(), self.shape[0]]
        act = ACTIVATION_FLAGS[self.activations]
        body = [
            v
            for p in self.parts
            for v in (p.qtype | (QDESC_INTERLEAVED | act if p.interleaved else 0), p.rows, p.data.shape[1],
                      p.data.data_ptr())
        ]  # fmt: skip
        return torch.tensor(head + body, dtype=torch.int64)

    # -- reference computations --------------------------------------------------------------------------
    def dequantize(self, dtype: torch.dtype = torch.float32, with_gain: bool = True) -> torch.Tensor:
        """The matrix the kernels multiply by: gguf-py's dequantization of every part (times the gain)."""
        rows = [
            torch.from_numpy(
                np.ascontiguousarray(gguf_dequantize(p.plain().numpy(), QType(p.qtype)), dtype=np.float32)
            ).reshape(p.rows, self.in_features)
            for p in self.parts
        ]
        w = rows[0] if len(rows) == 1 else torch.cat(rows)
        if with_gain and self.gain is not None:
            w = w * self.gain
        return w.to(dtype)

    def __repr__(self) -> str:
        return f"BlockQuantWeight({self.name!r}, {tuple(self.shape)}, {'+'.join(self.types)})"


def weight_nbytes(w: torch.Tensor | BlockQuantWeight | Int8Weight) -> int:
    """Resident bytes of a plain tensor, a block-quantized matrix or an int8 one (its q and scales)."""
    if isinstance(w, BlockQuantWeight):
        return w.nbytes
    if isinstance(w, Int8Weight):
        return w.q.numel() + w.scale.numel() * 4
    return w.numel() * w.element_size()


def embedding(
    ids: torch.Tensor, weight: torch.Tensor | BlockQuantWeight, dtype: torch.dtype, kernel: object = None
) -> torch.Tensor:
    """``F.embedding`` for a plain or a block-quantized table (rows dequantized by ``kernel``, the native
    block kernels, when given; else through the reference), as ``dtype``."""
    if not isinstance(weight, BlockQuantWeight):
        return F.embedding(ids, weight)
    if kernel is not None:
        return kernel.rows(weight, ids).to(dtype)
    flat = ids.reshape(-1)
    return weight.take_rows(flat).dequantize(dtype, with_gain=False).reshape(*ids.shape, weight.in_features)


def total_nbytes(tensors: Sequence[torch.Tensor | BlockQuantWeight]) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += weight_nbytes(t)
    return total

