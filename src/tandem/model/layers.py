"""The decoder layer shared by Llama, Qwen2 and Qwen3: RMSNorm, attention over the paged cache, SwiGLU.

Family differences are data, not code paths: Qwen2's q/k/v bias is an optional bias on the fused ``qkv``
matmul, Qwen3's per-head q/k RMSNorm an optional weight. Weights are parameters (so ``state_dict``,
``.to`` and sharing work as usual) but the forward calls functional ops directly: at decode, one layer is
about fifteen small kernels, and per-call Python overhead is a visible share of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tandem.model.attention import AttentionBackend
from tandem.model.model_args import ModelArgs
from tandem.model.rope import apply_rope
from tandem.model.weights import LayerWeights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last axis, normalised in float32."""
    if x.dtype == torch.float32:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def unit_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without its gain and divided by ``sqrt(n)``: ``x / sqrt(sum(x^2) + n * eps)``.

    The gain times ``sqrt(n)`` lives in the consumer's weights (see weights.py), which leaves four kernels
    here instead of seven. The sum of squares is taken in float32.
    """
    n = x.shape[-1]
    if x.dtype == torch.float32:
        return x * torch.linalg.vecdot(x, x).add_(n * eps).rsqrt_().unsqueeze(-1)
    xf = x.float()
    return x * torch.linalg.vecdot(xf, xf).add_(n * eps).rsqrt_().unsqueeze(-1).to(x.dtype)


@dataclass(frozen=True)
class LayerContext:
    """What every layer of one forward shares: built once per forward, passed explicitly."""

    rotations: torch.Tensor  # [T, 1, head_dim // 2] complex, RoPE rotation of each token's position
    attn_metadata: Any  # the backend's per-forward metadata


def _param(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t, requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, weights: LayerWeights, backend: AttentionBackend) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
        )
        self.intermediate = args.intermediate_size
        self.eps = args.rms_norm_eps
        self.scale = args.head_dim**-0.5
        self.backend = backend
        self.qkv = nn.Parameter(weights.qkv, requires_grad=False)
        self.qkv_bias = _param(weights.qkv_bias)
        self.qk_norm = _param(weights.qk_norm)
        self.o_proj = nn.Parameter(weights.o_proj, requires_grad=False)
        self.o_bias = _param(weights.o_bias)
        self.gate_up = nn.Parameter(weights.gate_up, requires_grad=False)
        self.down = nn.Parameter(weights.down, requires_grad=False)

    def forward(
        self,
        x: torch.Tensor,
        ctx: LayerContext,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """``x`` is the residual stream ``[T, hidden]``; returns the stream after this layer."""
        attn = self._attention(unit_rms(x, self.eps), ctx, k_cache, v_cache)
        # addmm folds each residual add into the projection that feeds it.
        if self.o_bias is None:
            x = torch.addmm(x, attn, self.o_proj.t())
        else:
            x = x + F.linear(attn, self.o_proj, self.o_bias)
        gate_up = F.linear(unit_rms(x, self.eps), self.gate_up)
        gate, up = gate_up[:, : self.intermediate], gate_up[:, self.intermediate :]
        return torch.addmm(x, F.silu(gate).mul_(up), self.down.t())

    def _attention(
        self, h: torch.Tensor, ctx: LayerContext, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """Attention output before ``o_proj``: ``[T, heads * head_dim]``."""
        t = h.shape[0]
        heads, kv_heads, hd = self.heads, self.kv_heads, self.head_dim
        qkv = F.linear(h, self.qkv, self.qkv_bias)
        qk = qkv[:, : (heads + kv_heads) * hd].view(t, heads + kv_heads, hd)
        if self.qk_norm is not None:
            qk = rms_norm(qk, self.qk_norm, self.eps)
        qk = apply_rope(qk, ctx.rotations)
        v = qkv[:, (heads + kv_heads) * hd :].view(t, kv_heads, hd)
        out = self.backend.forward(
            qk[:, :heads], qk[:, heads:], v, k_cache, v_cache, ctx.attn_metadata, self.scale
        )
        return out.reshape(t, heads * hd)
