"""Rotary position embedding (RoPE): frequencies, a precomputed rotation table, and its application.

Hugging Face checkpoints rotate the pair ``(x[i], x[i + d/2])`` of each head by ``pos * inv_freq[i]``
("rotate half" layout). tandem instead permutes the q/k projection rows once at load time so the pair sits
at ``(x[2i], x[2i+1])``; RoPE is then one complex multiplication per forward instead of five element-wise
kernels. The permutation is applied to q and k alike, so every q·k dot product - and hence the attention
output - is unchanged; only the K cache holds keys in the permuted order, and only this model reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

_PLAIN_ROPE_TYPES = ("default", None)


def rope_inv_freq(head_dim: int, theta: float, scaling: Mapping[str, Any] | None) -> torch.Tensor:
    """``inv_freq[i]`` (float32, ``[head_dim // 2]``) after the checkpoint's ``rope_scaling``."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = None
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type in _PLAIN_ROPE_TYPES:
        return inv_freq
    assert scaling is not None
    if rope_type == "linear":
        return inv_freq / float(_need(scaling, "factor"))
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(
        f"rope_scaling.rope_type {rope_type!r} is not supported (supported: default, linear, llama3)"
    )


def _need(scaling: Mapping[str, Any], key: str) -> Any:
    if key not in scaling:
        raise ValueError(f"rope_scaling is missing field {key!r}: {dict(scaling)}")
    return scaling[key]


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by ``factor``, short ones kept, a smooth blend between.

    The band edges are wavelengths ``original_max_position_embeddings / {low,high}_freq_factor``.
    """
    factor = float(_need(scaling, "factor"))
    low = float(_need(scaling, "low_freq_factor"))
    high = float(_need(scaling, "high_freq_factor"))
    old_context = float(_need(scaling, "original_max_position_embeddings"))
    wavelen = 2 * math.pi / inv_freq
    slowed = inv_freq / factor
    # Blend weight rises from 0 at the long-wavelength edge to 1 at the short-wavelength edge.
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * slowed + smooth * inv_freq
    out = torch.where(wavelen > old_context / low, slowed, blended)
    return torch.where(wavelen < old_context / high, inv_freq, out)


def rotation_table(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """``exp(i * pos * inv_freq)`` for every position: complex64 ``[max_positions, head_dim // 2]``.

    Angles are computed in float32 as ``pos * inv_freq``, the same products the reference computes.
    """
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq.float())
    return torch.polar(torch.ones_like(angles), angles)


def interleave_permutation(head_dim: int) -> torch.Tensor:
    """Index map taking a head's "rotate half" layout to interleaved pairs: ``new[2i], new[2i+1] =
    old[i], old[i + d/2]``."""
    return torch.arange(head_dim).view(2, head_dim // 2).t().reshape(-1)


def interleave_heads(weight: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Permute the per-head output rows of a q/k projection weight ``[heads*d, in]`` or bias
    ``[heads*d]`` (or a per-head norm weight ``[d]`` with ``num_heads=1``) into interleaved pairs."""
    perm = interleave_permutation(head_dim).to(weight.device)
    rest = weight.shape[1:]
    return weight.reshape(num_heads, head_dim, *rest)[:, perm].reshape(weight.shape).contiguous()


def apply_rope(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, head_dim]`` (interleaved pairs) by ``rotations`` ``[T, 1, head_dim//2]``.

    Returns a new contiguous tensor of ``x``'s dtype. Low-precision inputs are rotated in float32.
    """
    t, heads, head_dim = x.shape
    pairs = x.reshape(t, heads, head_dim // 2, 2)
    if pairs.dtype != torch.float32:
        pairs = pairs.float()
    rotated = torch.view_as_real(torch.view_as_complex(pairs) * rotations).view(t, heads, head_dim)
    return rotated if rotated.dtype == x.dtype else rotated.to(x.dtype)
