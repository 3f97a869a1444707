"""Weight-only int8: symmetric, one float32 scale per output feature (``w[o] ~= scale[o] * q[o]``).

For a drafter's matrices under a float32 target (``speculative_config.draft_dtype = "int8"``): a draft pass is
a few one-row products whose time is the bytes they stream, and drafts only propose (the target verifies
every token exactly), so a quarter of float32's bytes costs at most some acceptance, never correctness.
The native few-row kernels (``native/gemv.h``) multiply by ``q`` in float32 and apply the scale per output;
anything else (a prefill chunk's many rows, the torch reference) uses :meth:`Int8Weight.dequantize`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QMAX = 127  # symmetric: -127 .. 127 (no -128, so q and -q are both representable)


@dataclass(frozen=True)
class Int8Weight:
    q: torch.Tensor  # [out, in] int8, contiguous
    scale: torch.Tensor  # [out] float32, contiguous

    def __post_init__(self) -> None:
        if self.q.dtype != torch.int8 or self.q.dim() != 2 or not self.q.is_contiguous():
            raise ValueError(f"Int8Weight.q must be a contiguous [out, in] int8 tensor, got {self.q.dtype}")
        if self.scale.dtype != torch.float32 or tuple(self.scale.shape) != (self.q.shape[0],):
            raise ValueError(f"Int8Weight.scale must be float32 [{self.q.shape[0]}]")

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int8Weight:
        """Round each row to the nearest multiple of its scale ``max |w[o]| / 127`` (an all-zero row: 1)."""
        w = weight.detach().float()
        if w.dim() != 2:
            raise ValueError(f"Int8Weight.quantize: a [out, in] matrix, got shape {tuple(w.shape)}")
        amax = w.abs().amax(dim=1)
        scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
        q = torch.round(w / scale.unsqueeze(1)).clamp(-QMAX, QMAX).to(torch.int8)
        return cls(q.contiguous(), scale.contiguous())

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The matrix the int8 product computes with: ``scale[o] * q[o][i]`` (float32, then ``dtype``)."""
        return (self.q.float() * self.scale.unsqueeze(1)).to(dtype)
