"""The decoder layer shared by Llama, Qwen2 and Qwen3: RMSNorm, attention over the paged cache, SwiGLU.

Family differences are data, not code paths: Qwen2's q/k/v bias is an optional bias on the fused ``qkv``
matmul, Qwen3's per-head q/k RMSNorm an optional weight. Weights are parameters (``state_dict`` and
sharing work as usual; the dtype is fixed when the model is built) but the forward calls functional ops
and keeps the kernel count low: at decode, every small kernel between two weight-streaming matmuls
costs far more than its arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tandem.distributed.communicator import SINGLE_RANK, Communicator
from tandem.model.attention import AttentionBackend
from tandem.model.block_quant import BlockQuantWeight
from tandem.model.quant import Int8Weight
from tandem.model.linear import LinearKernels
from tandem.model.model_args import ModelArgs
from tandem.model.parallel import ShardPlan, row_parallel_add
from tandem.model.rope import apply_rope
from tandem.model.weights import LayerWeights


def unit_rms(x: torch.Tensor, eps_root: torch.Tensor) -> torch.Tensor:
    """RMSNorm without its gain, divided by ``sqrt(n)``: ``x / sqrt(sum(x^2) + n * eps)``.

    ``eps_root`` is the scalar tensor ``sqrt(n * eps)`` in ``x``'s dtype, so the denominator is one
    ``hypot`` of the row norm: three kernels where ``F.rms_norm`` runs seven. That matters at decode, where
    each small kernel between two weight-streaming matmuls costs far more than its arithmetic. The gains,
    times ``sqrt(n)``, live in the weights that consume the result (weights.py). The norm accumulates in
    float32 for every input dtype; for bf16 only the final denominator is rounded to bf16.
    """
    return x / torch.hypot(torch.linalg.vector_norm(x, dim=-1, keepdim=True), eps_root)


@dataclass(frozen=True)
class LayerContext:
    """What every layer of one forward shares: built once per forward, passed explicitly."""

    rotations: torch.Tensor  # [T, 1, head_dim // 2] complex, RoPE rotation of each token's position
    attn_metadata: Any  # the backend's per-forward metadata
    eps_root: torch.Tensor  # scalar sqrt(hidden * rms_norm_eps) in the model dtype, see unit_rms


def _param(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t, requires_grad=False)


def frozen_weight(t: torch.Tensor | BlockQuantWeight | Int8Weight) -> nn.Parameter | BlockQuantWeight | Int8Weight:
    """A frozen parameter, or a block-quantized / int8 matrix as it is (a plain attribute: no tensor to
    register)."""
    return t if isinstance(t, (BlockQuantWeight, Int8Weight)) else nn.Parameter(t, requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        args: ModelArgs,
        weights: LayerWeights,
        backend: AttentionBackend,
        linear: LinearKernels,
        shard: ShardPlan | None = None,
        comm: Communicator = SINGLE_RANK,
    ) -> None:
        super().__init__()
        # Under tensor parallelism this rank's heads and intermediate slice (model/parallel.py).
        shard = shard if shard is not None else ShardPlan.single(args)
        self.heads, self.kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, args.head_dim
        self.intermediate = shard.ffn_size
        self.comm = comm
        self.eps = args.rms_norm_eps
        self.scale = args.head_dim**-0.5
        self.backend = backend
        self.linear = linear
        self.qkv = frozen_weight(weights.qkv)
        self.qkv_bias = _param(weights.qkv_bias)
        self.qk_norm = _param(weights.qk_norm)
        self.o_proj = frozen_weight(weights.o_proj)
        self.o_bias = _param(weights.o_bias)
        self.gate_up = frozen_weight(weights.gate_up)
        self.down = frozen_weight(weights.down)

    def forward(
        self,
        x: torch.Tensor,
        ctx: LayerContext,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """``x`` is the residual stream ``[T, hidden]``; returns the stream after this layer."""
        attn = self._attention(unit_rms(x, ctx.eps_root), ctx, k_cache, v_cache)
        # Each residual add is fused into the projection that feeds it; o_proj and down are
        # row-parallel (one all-reduce each under tensor parallelism, none for one rank).
        mm = self.linear
        x = row_parallel_add(mm, x, attn, self.o_proj, self.o_bias, self.comm)
        gate_up = mm.linear(unit_rms(x, ctx.eps_root), self.gate_up)
        gate, up = gate_up[:, : self.intermediate], gate_up[:, self.intermediate :]
        return row_parallel_add(mm, x, F.silu(gate).mul_(up), self.down, None, self.comm)

    def _attention(
        self, h: torch.Tensor, ctx: LayerContext, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """Attention output before ``o_proj``: ``[T, heads * head_dim]``."""
        t = h.shape[0]
        heads, kv_heads, hd = self.heads, self.kv_heads, self.head_dim
        qkv = self.linear.linear(h, self.qkv, self.qkv_bias)
        qk = qkv[:, : (heads + kv_heads) * hd].view(t, heads + kv_heads, hd)
        if self.qk_norm is not None:
            qk = F.rms_norm(qk, (hd,), None, self.eps) * self.qk_norm
        qk = apply_rope(qk, ctx.rotations)
        v = qkv[:, (heads + kv_heads) * hd :].view(t, kv_heads, hd)
        out = self.backend.forward(
            qk[:, :heads], qk[:, heads:], v, k_cache, v_cache, ctx.attn_metadata, self.scale
        )
        return out.reshape(t, heads * hd)
