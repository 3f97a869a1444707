"""Tensor parallelism for the decoder: which slice of each weight a rank holds, and the three
communicating operations (vocab-parallel embedding, row-parallel projection, vocab-parallel logits).

Layout (Megatron-style, one all-reduce per attention block and one per MLP block):
- attention: q/k/v are column-parallel by *KV group* (a KV head with its query heads), so a rank's
  attention needs no communication; ``o_proj`` is row-parallel over the matching input columns.
  With at least as many KV heads as ranks, whole groups are split as evenly as possible and the first
  ranks take the extra ones: 3 groups of 3 query heads on 2 ranks give rank 0 groups 0-1 (6 query
  heads) and rank 1 group 2 (3 query heads) — uneven, not padded, so no compute is wasted on fake
  heads and the KV cache holds exactly the model's heads. With fewer KV heads than ranks, every KV head
  is replicated on ``world / kv_heads`` ranks that split its query heads (needs ``world % kv_heads ==
  0`` and at least one query head per rank).
- MLP: gate and up column-parallel (the intermediate dimension split evenly), down row-parallel.
- embedding: vocab-parallel rows; ids outside a rank's rows are looked up as row 0 and zeroed, then
  summed over ranks. LM head (tied or not): the same vocab rows; each rank computes its vocab slice of
  the logits and an all-gather assembles the full row (pieces padded to one length for the gather).
- Row-parallel sums: rank 0 adds the residual (and the bias) to its partial product, the others
  contribute their partial products only, so the all-reduce yields ``residual + x W^T (+ b)``.

One implementation: an unsharded model is the one-rank plan with the ``SingleRank`` communicator, and
for it every function below runs exactly the unsharded arithmetic (the "collectives" return their input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tandem.distributed.communicator import Communicator
from tandem.model.block_quant import BlockQuantWeight, embedding
from tandem.model.linear import LinearKernels
from tandem.model.model_args import ModelArgs

if TYPE_CHECKING:
    from tandem.native.quant_linear import QuantLinearKernel


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of part ``index`` when ``n`` items are split into ``parts`` contiguous parts
    as evenly as possible, the first ``n % parts`` parts one item longer."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


@dataclass(frozen=True)
class ShardPlan:
    """The global index ranges one rank holds; ``[start, stop)`` each."""

    rank: int
    world_size: int
    heads: tuple[int, int]  # query heads
    kv_heads: tuple[int, int]
    ffn: tuple[int, int]  # intermediate (gate / up rows, down columns)
    vocab: tuple[int, int]  # embedding / LM head rows
    vocab_total: int  # the model's vocabulary

    @classmethod
    def build(cls, args: ModelArgs, world_size: int, rank: int) -> ShardPlan:
        """Raises ``ValueError`` naming the dimension that cannot be split over ``world_size`` ranks."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a world of {world_size}")
        heads, kv = args.num_attention_heads, args.num_key_value_heads
        group = heads // kv
        if kv >= world_size:
            lo, hi = split_range(kv, world_size, rank)
            kv_range, head_range = (lo, hi), (lo * group, hi * group)
        else:
            if world_size % kv:
                raise ValueError(
                    f"tensor_parallel_size {world_size} cannot share {kv} KV heads: with fewer KV "
                    f"heads than ranks it must be a multiple of num_key_value_heads ({kv})"
                )
            per = world_size // kv  # ranks sharing (replicating) one KV head
            if group < per:
                raise ValueError(
                    f"tensor_parallel_size {world_size} exceeds the query heads: each of the {kv} KV "
                    f"heads has {group} query heads to split over {per} ranks"
                )
            g = rank // per
            lo, hi = split_range(group, per, rank % per)
            kv_range, head_range = (g, g + 1), (g * group + lo, g * group + hi)
        for name, size in (("intermediate_size", args.intermediate_size), ("vocab_size", args.vocab_size)):
            if size < world_size:
                raise ValueError(f"{name} ({size}) is smaller than tensor_parallel_size {world_size}")
        return cls(
            rank, world_size, head_range, kv_range,
            split_range(args.intermediate_size, world_size, rank),
            split_range(args.vocab_size, world_size, rank), args.vocab_size,
        )

    @classmethod
    def single(cls, args: ModelArgs) -> ShardPlan:
        return cls.build(args, 1, 0)

    @classmethod
    def all_ranks(cls, args: ModelArgs, world_size: int) -> list[ShardPlan]:
        return [cls.build(args, world_size, r) for r in range(world_size)]

    # -- local sizes -------------------------------------------------------------------------------------
    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def ffn_size(self) -> int:
        return self.ffn[1] - self.ffn[0]

    @property
    def vocab_size(self) -> int:
        return self.vocab[1] - self.vocab[0]

    @property
    def vocab_stride(self) -> int:
        """The longest rank's vocab slice: logits pieces are padded to it for the all-gather."""
        return -(-self.vocab_total // self.world_size)

    def vocab_slices(self) -> list[tuple[int, int]]:
        """Every rank's vocab rows, in rank order."""
        return [split_range(self.vocab_total, self.world_size, r) for r in range(self.world_size)]

    # -- slices of the checkpoint's tensors --------------------------------------------------------------
    def q_rows(self, head_dim: int) -> slice:
        """Rows of q_proj (and columns of o_proj) this rank holds."""
        return slice(self.heads[0] * head_dim, self.heads[1] * head_dim)

    def kv_rows(self, head_dim: int) -> slice:
        return slice(self.kv_heads[0] * head_dim, self.kv_heads[1] * head_dim)

    @property
    def ffn_rows(self) -> slice:
        return slice(*self.ffn)

    @property
    def vocab_rows(self) -> slice:
        return slice(*self.vocab)


# -- the communicating operations ------------------------------------------------------------------------
def vocab_parallel_embedding(
    ids: torch.Tensor, weight: torch.Tensor | BlockQuantWeight, shard: ShardPlan, comm: Communicator,
    kernel: QuantLinearKernel | None = None,
) -> torch.Tensor:
    """``weight`` holds rows ``shard.vocab`` of the embedding; returns the full ``[T, hidden]`` lookup.
    ``kernel``: the native block kernels for a block-quantized table (None: the reference)."""
    if isinstance(weight, BlockQuantWeight):  # one rank holds every row (block_quant refuses more)
        return kernel.rows(weight, ids) if kernel is not None else embedding(ids, weight, torch.float32)
    local = ids - shard.vocab[0]
    inside = (local >= 0) & (local < shard.vocab_size)
    out = F.embedding(torch.where(inside, local, torch.zeros_like(local)), weight)
    out.masked_fill_(~inside.unsqueeze(-1), 0)
    return comm.all_reduce(out)


def row_parallel_add(
    mm: LinearKernels,
    residual: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    comm: Communicator,
) -> torch.Tensor:
    """``residual + x_full @ W_full^T (+ bias)`` from this rank's input columns ``x`` / ``weight``."""
    if comm.rank == 0:  # the residual and the bias enter the sum once, with rank 0's partial product
        out = mm.linear_add(residual, x, weight) if bias is None else residual + mm.linear(x, weight, bias)
    else:
        out = mm.linear(x, weight)
    return comm.all_reduce(out)


def gather_vocab_logits(local: torch.Tensor, shard: ShardPlan, comm: Communicator) -> torch.Tensor:
    """``[N, shard.vocab_size]`` logits of this rank's vocab rows -> ``[N, vocab]`` on every rank."""
    if comm.world_size == 1:
        return local
    stride = shard.vocab_stride
    pad = stride - local.shape[-1]
    pieces = comm.all_gather(F.pad(local, (0, pad)) if pad else local)
    sizes = [hi - lo for lo, hi in shard.vocab_slices()]
    return torch.cat([piece[..., :n] for piece, n in zip(pieces, sizes)], dim=-1)


def gather_vocab_rows(weight: torch.Tensor, shard: ShardPlan, comm: Communicator) -> torch.Tensor:
    """``[shard.vocab_size, H]`` rows of a vocab-parallel matrix -> the whole ``[vocab, H]`` on every
    rank (once, at start-up: a proposer that runs whole on every rank needs the whole vocabulary)."""
    if comm.world_size == 1:
        return weight
    return gather_vocab_logits(weight.t().contiguous(), shard, comm).t().contiguous()
