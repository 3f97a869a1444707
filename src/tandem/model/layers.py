"""The decoder layer shared by Llama, Qwen2, Qwen3 and Gemma 3: RMSNorm, attention over the paged cache, a
gated MLP.

Family differences are data, not code paths: Qwen2's q/k/v bias is an optional bias on the fused ``qkv``
matmul, Qwen3's per-head q/k RMSNorm an optional weight; Gemma 3's norms after attention and after the MLP
are optional gains, its GELU (tanh) the ``hidden_act``, and each layer takes its KV cache group's attention
metadata and, if it has a sliding window, the local RoPE rotations (:class:`LayerContext`). Weights are parameters (``state_dict`` and
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
    # Sliding-window layers (ModelArgs.layer_windows): their rotations (their own RoPE base); the global ones
    # where the model has none.
    local_rotations: torch.Tensor | None = None
    # Attention metadata of KV cache groups 1.. (core/kv_cache_manager.py; group 0's is attn_metadata).
    group_metadata: tuple[Any, ...] = ()


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
        index: int = 0,
        kv_group: int = 0,
    ) -> None:
        super().__init__()
        # Under tensor parallelism this rank's heads and intermediate slice (model/parallel.py).
        shard = shard if shard is not None else ShardPlan.single(args)
        self.heads, self.kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, args.head_dim
        self.intermediate = shard.ffn_size
        self.comm = comm
        self.eps = args.rms_norm_eps
        self.scale = args.attention_scale
        self.sliding = args.window(index) > 0
        self.kv_group = kv_group  # the KV cache group whose block table this layer's pages follow
        self.gelu = args.hidden_act == "gelu_tanh"
        self.backend = backend
        self.linear = linear
        self.qkv = frozen_weight(weights.qkv)
        self.qkv_bias = _param(weights.qkv_bias)
        self.qk_norm = _param(weights.qk_norm)
        self.o_proj = frozen_weight(weights.o_proj)
        self.o_bias = _param(weights.o_bias)
        self.gate_up = frozen_weight(weights.gate_up)
        self.down = frozen_weight(weights.down)
        self.post_attn_norm = _param(weights.post_attn_norm)
        self.post_ffn_norm = _param(weights.post_ffn_norm)

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
        x = self._residual_add(x, attn, self.o_proj, self.o_bias, self.post_attn_norm, ctx)
        gate_up = mm.linear(unit_rms(x, ctx.eps_root), self.gate_up)
        gate, up = gate_up[:, : self.intermediate], gate_up[:, self.intermediate :]
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self._residual_add(x, act.mul_(up), self.down, None, self.post_ffn_norm, ctx)

    def _residual_add(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        weight: Any,
        bias: torch.Tensor | None,
        post_norm: torch.Tensor | None,
        ctx: LayerContext,
    ) -> torch.Tensor:
        """``x + h @ W^T (+ bias)``; with a post-norm gain (Gemma 3) ``x + rms_norm(h @ W^T) * gain``."""
        if post_norm is None:
            return row_parallel_add(self.linear, x, h, weight, bias, self.comm)
        y = self.comm.all_reduce(self.linear.linear(h, weight, bias if self.comm.rank == 0 else None))
        return torch.addcmul(x, unit_rms(y, ctx.eps_root), post_norm)

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
        local = self.sliding and ctx.local_rotations is not None
        qk = apply_rope(qk, ctx.local_rotations if local else ctx.rotations)
        v = qkv[:, (heads + kv_heads) * hd :].view(t, kv_heads, hd)
        meta = ctx.group_metadata[self.kv_group - 1] if self.kv_group else ctx.attn_metadata
        out = self.backend.forward(qk[:, :heads], qk[:, heads:], v, k_cache, v_cache, meta, self.scale)
        return out.reshape(t, heads * hd)
