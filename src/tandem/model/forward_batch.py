"""The flat token batch one model forward consumes, and the paged KV cache it writes.

A forward sees B requests whose *query* tokens are concatenated in batch order (T tokens in all): a request
may contribute a prefill chunk (many tokens), a single decode token, or a decode token plus k drafts to
verify. Request i owns rows ``query_start_loc[i]:query_start_loc[i+1]``. Its KV after this step holds
``seq_lens[i]`` tokens: the context already cached plus this step's query tokens, which the attention layer
writes into the cache by ``slot_mapping`` before attending.

Invariants (checked by :meth:`ForwardBatch.validate`):
- ``query_start_loc`` is non-decreasing, starts at 0 and ends at T; every request has at least one token.
- ``seq_lens[i] >= query_len(i)``; the query tokens are the *last* ``query_len(i)`` tokens of the sequence,
  so their positions are ``seq_lens[i] - query_len(i) ... seq_lens[i] - 1``.
- ``slot_mapping[t] = block_tables[i][pos // block_size] * block_size + pos % block_size``.

A *tree* step (speculation with a draft tree, ``tree_masks`` set) differs in one way: request i's query rows
are a tree in topological order (row 0 the root, each node after its parent). Row j is still *written* at
sequence index ``seq_lens[i] - query_len(i) + j`` (its slot) and sees keys up to it, but of the 64 keys up to
its own only those its bits in ``tree_masks`` set (bit b: the key b before its own — itself, its ancestors and
the context; every key further back is visible), and its *position* (RoPE) is the context length plus its
depth. (Bits relative to the row's own key serve any layout: a draft head's tree levels, whose ancestors were
written by earlier steps, too.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, flat slot index into [num_blocks * block_size]
    block_tables: torch.Tensor  # [B, max_blocks_per_req] int64, rows padded with 0
    query_start_loc: list[int]  # host, B + 1
    seq_lens: list[int]  # host, B
    # Rows of the final hidden state to turn into logits (e.g. the last token of each request, or all
    # k+1 verify positions). None means every row.
    logits_indices: torch.Tensor | None = None
    # Per-backend metadata built once per forward and shared by every layer (see attention.py).
    attn_metadata: Any = field(default=None, repr=False)
    # Exact sequence lengths on the device, when the host only knows upper bounds for some requests
    # (deferred reconciliation: the previous step's accepted counts are not on the host yet). Then
    # ``seq_lens`` holds those upper bounds; such requests always have short queries (1 + drafts).
    seq_lens_dev: torch.Tensor | None = None
    # KV cache groups 1.. of a sliding-window model (core/kv_cache_manager.py): their block tables and slot
    # mappings, like the two above (which are group 0's). Empty: every layer uses the two above.
    group_block_tables: list[torch.Tensor] = field(default_factory=list)
    group_slot_mappings: list[torch.Tensor] = field(default_factory=list)
    # Tree steps: [T] int64, row t's visible keys among the 64 up to its own (bit b: b keys before it).
    # None: causal (every key up to its own), as for every step that is not a tree.
    tree_masks: torch.Tensor | None = None
    # T and B (derived; a batch is built once per forward and never changed: ``replace`` builds a new one)
    num_tokens: int = field(init=False)
    num_reqs: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_tokens = int(self.input_ids.shape[0])
        self.num_reqs = len(self.seq_lens)

    def query_len(self, i: int) -> int:
        return self.query_start_loc[i + 1] - self.query_start_loc[i]

    def validate(self, block_size: int) -> None:
        """Check the invariants above (debug mode and tests; costs a host sync)."""
        qsl, n = self.query_start_loc, self.num_reqs
        if len(qsl) != n + 1 or qsl[0] != 0 or qsl[-1] != self.num_tokens:
            raise ValueError(f"query_start_loc {qsl} does not cover {self.num_tokens} tokens")
        if self.positions.shape[0] != self.num_tokens or self.slot_mapping.shape[0] != self.num_tokens:
            raise ValueError("positions / slot_mapping length differs from input_ids")
        pos = self.positions.tolist()
        slots = self.slot_mapping.tolist()
        bits = self.tree_masks.tolist() if self.tree_masks is not None else None
        tables = self.block_tables.tolist()
        for i in range(n):
            q = self.query_len(i)
            if q < 1 or self.seq_lens[i] < q:
                raise ValueError(f"request {i}: query_len {q}, seq_len {self.seq_lens[i]}")
            start = self.seq_lens[i] - q
            for j, t in enumerate(range(qsl[i], qsl[i + 1])):
                depth = j
                if bits is not None:
                    own = bits[t] & ((2 << j) - 1)  # the bits of the request's rows 0..j (bit j - r: row r)
                    context = min(start, 63 - j)  # the context keys within reach, all visible
                    if not own & 1 or not own >> j & 1 or (bits[t] >> (j + 1)) & ((1 << context) - 1) != (1 << context) - 1:
                        raise ValueError(f"request {i}: tree mask {bits[t] & (1 << 64) - 1:#x} of row {t} must hold "
                                         f"itself (bit 0), the root (bit {j}) and the context")
                    depth = own.bit_count() - 1
                if pos[t] != start + depth:
                    raise ValueError(f"request {i}: position {pos[t]} at row {t}, expected {start + depth}")
                p = start + j
                want = tables[i][p // block_size] * block_size + p % block_size
                if slots[t] != want:
                    raise ValueError(f"request {i}: slot {slots[t]} at row {t}, expected {want}")


def move_rows_reference(tensors: list[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """Rows ``src_slots`` of each ``[blocks, block_size, ...]`` tensor to rows ``dst_slots`` (flat slots), every
    source read before any destination is written: ``KVCache.move_rows``' torch path and its native kernel's
    reference."""
    for t in tensors:
        rows = t.view(-1, *t.shape[2:])
        rows.index_copy_(0, dst_slots, rows.index_select(0, src_slots))


@dataclass
class KVCache:
    """Per-layer K and V tensors of shape ``[num_blocks, block_size, num_kv_heads, head_dim]``.

    With KV cache groups (a sliding-window model, core/kv_cache_manager.py) layers share tensors: the layer at
    position ``j`` of its group uses tensor ``j``, and its group's block table says which pages are its."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        layer_tensor: list[int] | None = None,
    ) -> KVCache:
        """``layer_tensor[i]``: the tensor layer ``i`` uses (default: one of its own)."""
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        index = layer_tensor if layer_tensor is not None else list(range(num_layers))
        ks = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(max(index) + 1)]
        vs = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(max(index) + 1)]
        return cls(k=[ks[i] for i in index], v=[vs[i] for i in index])

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    def move_rows(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Copy every layer's K/V rows at flat slots ``src_slots`` to ``dst_slots`` (``[n]`` int64 each, distinct
        destinations): a tree step's accepted branch, written at its nodes' slots, moved to the sequence's
        next positions. All sources are read before any destination is written, so the two may overlap. On
        the CPU with native kernels one C call moves every tensor's rows (``native/kv_rows.c``); the torch
        reference is :func:`move_rows_reference`."""
        if self._rows_kernel is not None:
            self._rows_kernel(src_slots, dst_slots)
        else:
            move_rows_reference(self._distinct_tensors, src_slots, dst_slots)

    def move_branches(self, tables: torch.Tensor, rows: torch.Tensor, root: torch.Tensor, nodes: torch.Tensor) -> None:
        """Tree steps' accepted branches into place: request b's accepted nodes ``nodes[b]`` (``[B, D]`` node
        numbers, -1 padded), whose rows were written at keys ``root[b] + node`` through row ``rows[b]`` of the
        block tables ``tables``, to keys ``root[b] + 1 + i`` (a pair past the accepted count copies a row onto
        itself). On the CPU with native kernels one C call computes the slots and moves the rows; else the
        slots in torch and :meth:`move_rows`."""
        if self._rows_kernel is not None and tables.device.type == "cpu":
            self._rows_kernel.move_branches(tables, rows, root, nodes)
            return
        # (a local import: the attention modules import this one)
        from tandem.model.attention.base import slots_for_positions

        dst = root.unsqueeze(1) + torch.arange(1, nodes.shape[1] + 1, device=nodes.device)
        src = torch.where(nodes >= 0, root.unsqueeze(1) + nodes, dst)
        t, bs = tables.index_select(0, rows), self.block_size
        self.move_rows(slots_for_positions(t, src, bs).reshape(-1), slots_for_positions(t, dst, bs).reshape(-1))

    @cached_property
    def _distinct_tensors(self) -> list[torch.Tensor]:
        """Every K and V tensor once (layers of one KV cache group share a tensor)."""
        seen: dict[int, torch.Tensor] = {}
        for t in (*self.k, *self.v):
            seen.setdefault(id(t), t)
        return list(seen.values())

    @cached_property
    def _rows_kernel(self) -> Any:
        """The native row mover bound to these tensors where it takes them, else None (the torch loop)."""
        from tandem.native.kv_rows import kv_rows_kernel

        kernel, tensors = kv_rows_kernel(), self._distinct_tensors
        return kernel.bind(tensors) if kernel is not None and kernel.takes(tensors) else None

    @cached_property
    def num_blocks(self) -> int:
        return int(self.k[0].shape[0])

    @cached_property
    def block_size(self) -> int:
        return int(self.k[0].shape[1])
