"""The causal language model: embedding, decoder layers over a paged KV cache, final norm, LM head.

One forward consumes a flat :class:`ForwardBatch` (prefill chunks, decodes and verify steps mixed) and
returns the final hidden states; logits are a separate call so callers project only the rows they sample.
Per-forward state (RoPE rotations, attention metadata) is built once at the top of :meth:`forward` and
passed down explicitly; the module itself holds only weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from tandem.core.kv_cache_manager import kv_cache_groups, layer_placement
from tandem.distributed.communicator import SINGLE_RANK, Communicator
from tandem.model.attention import (
    AttentionBackend,
    create_attention_backend,
    default_attention_backend,
)
from tandem.model.block_quant import BlockQuantWeight, total_nbytes
from tandem.model.forward_batch import ForwardBatch, KVCache
from tandem.model.layers import DecoderLayer, LayerContext, frozen_weight, unit_rms
from tandem.model.linear import LinearKernels, create_linear_kernels, default_linear_kernels
from tandem.model.model_args import ModelArgs
from tandem.model.native_decode import NativeDecode
from tandem.model.parallel import (
    ShardPlan,
    gather_vocab_logits,
    gather_vocab_rows,
    vocab_parallel_embedding,
)
from tandem.model.rope import rope_inv_freq, rotation_table
from tandem.model.weights import ModelWeights, prepare_weights


@dataclass
class ModelOutput:
    hidden_states: torch.Tensor  # [T, hidden], after the final norm
    # Residual stream after each requested layer, in the requested order (before any final norm).
    aux_hidden_states: list[torch.Tensor] = field(default_factory=list)


class CausalLM(nn.Module):
    """Llama / Qwen2 / Qwen3 / Gemma 3 decoder-only model. Build with :meth:`from_tensors`.

    Under tensor parallelism (``comm`` of more than one rank) the instance is one rank's shard:
    ``weights`` hold the rank's slices (``self.shard``), ``forward`` and ``compute_logits`` are
    collectives every rank calls in the same order, and both return full, identical tensors on every
    rank (model/parallel.py). ``args`` stays the whole model's.
    """

    def __init__(
        self,
        args: ModelArgs,
        weights: ModelWeights,
        backend: AttentionBackend,
        linear: LinearKernels,
        comm: Communicator = SINGLE_RANK,
    ) -> None:
        super().__init__()
        self._args = args
        self.comm = comm
        self.shard = ShardPlan.build(args, comm.world_size, comm.rank)
        self.attn_backend = backend
        self.linear = linear
        # A block-quantized table (quantization "gguf") is a plain attribute: embedding rows are
        # dequantized per lookup and the tied LM head multiplies by the blocks (block_quant.py).
        self.embed_tokens = frozen_weight(weights.embed)
        # Tied: the LM head IS the embedding parameter (speculative heads share it by reference).
        self.lm_head = (
            self.embed_tokens
            if weights.lm_head is None
            else frozen_weight(weights.lm_head)
        )
        # KV cache groups (core/kv_cache_manager.py): one for most models; Gemma 3's global layers, then its
        # window layers in runs of as many.
        self.kv_groups = kv_cache_groups(args.layer_windows, args.num_hidden_layers)
        self.layer_group, self.layer_tensor = layer_placement(self.kv_groups, args.num_hidden_layers)
        self.layers = nn.ModuleList(
            DecoderLayer(args, lw, backend, linear, self.shard, comm, i, self.layer_group[i])
            for i, lw in enumerate(weights.layers)
        )
        self.norm = nn.Parameter(weights.norm, requires_grad=False)
        inv_freq = rope_inv_freq(args.head_dim, args.rope_theta, args.rope_scaling)
        table = rotation_table(inv_freq, args.max_position_embeddings).to(weights.norm.device)
        self.rope_table: torch.Tensor
        self.register_buffer("rope_table", table, persistent=False)
        # Sliding-window layers rotate with their own base (Gemma 3: 10,000 where global layers use 1e6).
        self.local_rope_table: torch.Tensor | None = None
        if args.sliding:
            local_freq = rope_inv_freq(args.head_dim, args.rope_local_theta or args.rope_theta, None)
            self.local_rope_table = rotation_table(local_freq, args.max_position_embeddings).to(table.device)
        # Gemma 3 scales the embeddings by sqrt(hidden), rounded to the model dtype (as the reference).
        self.embed_multiplier = (
            torch.tensor(args.hidden_size**0.5, dtype=weights.norm.dtype) if args.embed_scale else None
        )
        eps_root = (args.hidden_size * args.rms_norm_eps) ** 0.5  # see unit_rms
        self.eps_root: torch.Tensor
        self.register_buffer(
            "eps_root",
            torch.tensor(eps_root, dtype=weights.norm.dtype, device=table.device),
            False,
        )
        # The native stack for short CPU steps (native_decode.py), resolved on the first forward so
        # that building a model never compiles anything; None where it can never apply.
        self._native: NativeDecode | None = None
        self._native_resolved = False
        self._checked_kv: KVCache | None = None  # the KV cache _check_cache last accepted
        # Whether short steps may take the native stack: the engine's resolved choice (tandem/execution.py);
        # None: this process's override (a model built directly, in tests and tools).
        self.native_decode: bool | None = None

    @classmethod
    def from_tensors(
        cls,
        args: ModelArgs,
        tensors: Mapping[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        attn_backend: str | AttentionBackend | None = None,
        linear_kernels: str | None = None,
        comm: Communicator = SINGLE_RANK,
        quant_activations: str = "float32",
        int8_weights: bool = False,
        native_decode: bool | None = None,
    ) -> CausalLM:
        """Build from Hugging Face-named tensors; raises ``ValueError`` naming any bad tensor.

        ``attn_backend`` names a registered attention backend (or is one; default
        :func:`default_attention_backend`); ``linear_kernels`` names
        the matrix-product formulations (default: ``cpu`` on CPU, ``torch`` elsewhere). ``comm``: this
        rank's tensor-parallel communicator (only the rank's weight slices are kept).
        ``quant_activations``: the inputs of block-quantized products; ``int8_weights``: weight-only int8
        layer matrices (both: tandem.quantization). ``native_decode``: whether short CPU steps may run the
        native decoder stack (default: unless ``TANDEM_NATIVE_DECODE=0``).
        """
        if not dtype.is_floating_point:
            raise ValueError(f"model dtype must be floating point, got {dtype}")
        if attn_backend is None:
            attn_backend = default_attention_backend(device)
        backend = (
            create_attention_backend(attn_backend, dtype)
            if isinstance(attn_backend, str)
            else attn_backend
        )
        linear = create_linear_kernels(linear_kernels or default_linear_kernels(device))
        shard = ShardPlan.build(args, comm.world_size, comm.rank)
        weights = prepare_weights(args, tensors, dtype, device, shard, quant_activations, int8_weights)
        model = cls(args, weights, backend, linear, comm)
        model.native_decode = native_decode
        return model

    @property
    def args(self) -> ModelArgs:
        return self._args

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (every plain weight's; block-quantized matrices compute in it)."""
        return self.norm.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.device

    @property
    def quantized(self) -> bool:
        """Whether the matrices stay in GGUF blocks (``quantization="gguf"``)."""
        return isinstance(self.layers[0].qkv, BlockQuantWeight) if self.num_layers else False

    def weight_nbytes(self) -> int:
        """Resident bytes of every weight (blocks as stored, plain tensors at their dtype; shared once)."""
        ws: list[torch.Tensor | BlockQuantWeight] = [self.embed_tokens, self.lm_head, self.norm]
        for layer in self.layers:
            ws += [layer.qkv, layer.o_proj, layer.gate_up, layer.down]
            extras = (layer.qkv_bias, layer.qk_norm, layer.o_bias, layer.post_attn_norm, layer.post_ffn_norm)
            ws += [t for t in extras if t is not None]
        return total_nbytes(ws)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = vocab_parallel_embedding(ids, self.embed_tokens, self.shard, self.comm, self.linear.quant)
        return x if self.embed_multiplier is None else x * self.embed_multiplier.to(x.device)

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        kv_cache: KVCache,
        aux_hidden_layers: Sequence[int] = (),
    ) -> ModelOutput:
        if kv_cache is not self._checked_kv:  # the runner passes the same cache every step
            self._check_cache(kv_cache)
            self._checked_kv = kv_cache
        for i in aux_hidden_layers:
            if not 0 <= i < self.num_layers:
                raise ValueError(f"aux_hidden_layers index {i} outside [0, {self.num_layers})")
        if batch.seq_lens and max(batch.seq_lens) > self.rope_table.shape[0]:
            raise ValueError(
                f"seq_lens reach {max(batch.seq_lens)} tokens, beyond the model's "
                f"max_position_embeddings ({self.rope_table.shape[0]})"
            )
        bs = kv_cache.block_size
        batch.attn_metadata = self.attn_backend.build_metadata(batch, bs, self.kv_groups[0][0])
        ctx = LayerContext(
            self.rope_table[batch.positions].unsqueeze(1), batch.attn_metadata, self.eps_root
        )
        if self.local_rope_table is not None:
            ctx = replace(ctx, local_rotations=self.local_rope_table[batch.positions].unsqueeze(1))
        if len(self.kv_groups) > 1:
            if not batch.group_block_tables and len({t.data_ptr() for t in kv_cache.k}) < self.num_layers:
                raise ValueError("kv_cache shares tensors between KV cache groups: the batch must carry "
                                 "every group's block tables (group_block_tables)")
            ctx = replace(ctx, group_metadata=tuple(self._group_metadata(batch, bs)))
        x = self.embed(batch.input_ids)
        native = self._native if self._native_resolved else self._native_decode()
        if native is not None and native.applies(batch):
            x, aux = native.run(batch, ctx, kv_cache, x, aux_hidden_layers)
        else:
            captured: dict[int, torch.Tensor] = {}
            for i, layer in enumerate(self.layers):
                x = layer(x, ctx, kv_cache.k[i], kv_cache.v[i])
                if i in aux_hidden_layers:
                    captured[i] = x
            aux = [captured[i] for i in aux_hidden_layers]
        hidden = unit_rms(x, self.eps_root) * self.norm
        return ModelOutput(hidden, aux)

    def _group_metadata(self, batch: ForwardBatch, block_size: int) -> list[Any]:
        """Attention metadata of KV cache groups 1..: the batch through each group's block table and slots
        (the worker's batches carry them); a batch without them (tests, drafters on their own caches, where
        every layer has a tensor of its own) uses group 0's for every group."""
        tables, slots = batch.group_block_tables, batch.group_slot_mappings
        if tables and len(tables) != len(self.kv_groups) - 1:
            raise ValueError(f"batch has block tables for {len(tables) + 1} KV cache groups, model {len(self.kv_groups)}")
        if not tables:  # the same tables for every group: one build per window
            built = {w: self.attn_backend.build_metadata(batch, block_size, w) for w, _ in self.kv_groups[1:]}
            return [built[w] for w, _ in self.kv_groups[1:]]
        return [
            self.attn_backend.build_metadata(
                replace(batch, block_tables=tables[g], slot_mapping=slots[g], attn_metadata=None,
                        group_block_tables=[], group_slot_mappings=[]),
                block_size, window,
            )
            for g, (window, _) in enumerate(self.kv_groups[1:])
        ]

    def _native_decode(self) -> NativeDecode | None:
        if not self._native_resolved:
            self._native = NativeDecode.create(self)
            self._native_resolved = True
        return self._native

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]`` -> float32 logits ``[N, vocab]``."""
        local = self.linear.linear(hidden, self.lm_head).float()
        return local if self.comm.world_size == 1 else gather_vocab_logits(local, self.shard, self.comm)

    def full_vocab_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(embedding, LM head) over the whole vocabulary: the parameters themselves for one rank;
        under tensor parallelism gathered from every rank's rows (a collective; tied stays tied)."""
        if self.comm.world_size == 1:
            return self.embed_tokens, self.lm_head
        embed = gather_vocab_rows(self.embed_tokens, self.shard, self.comm)
        if self.lm_head is self.embed_tokens:
            return embed, embed
        return embed, gather_vocab_rows(self.lm_head, self.shard, self.comm)

    def _check_cache(self, kv_cache: KVCache) -> None:
        args = self._args
        if len(kv_cache.k) != self.num_layers or len(kv_cache.v) != self.num_layers:
            raise ValueError(
                f"kv_cache has {len(kv_cache.k)} K / {len(kv_cache.v)} V layers, "
                f"model has {self.num_layers}"
            )
        tail = tuple(kv_cache.k[0].shape[2:])
        if tail != (self.shard.num_kv_heads, args.head_dim):
            raise ValueError(
                f"kv_cache.k[0] has shape {tuple(kv_cache.k[0].shape)}; expected "
                f"[blocks, block_size, {self.shard.num_kv_heads}, {args.head_dim}]"
            )
        if kv_cache.k[0].dtype != self.dtype:
            raise ValueError(
                f"kv_cache dtype {kv_cache.k[0].dtype} differs from model {self.dtype}"
            )
