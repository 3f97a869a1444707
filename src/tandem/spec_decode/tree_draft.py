"""Draft trees from a draft head: EAGLE-2's dynamic tree (Li et al., 2024), on the device.

Shape (:class:`TreeShape`): ``top_k`` children per expanded node, ``depth`` levels, ``max_nodes`` verified.

- Level 1: the head's distribution after the last accepted token gives the root's ``top_k`` children.
- Level d > 1: the nodes of level d - 1 with the highest *score* — the draft's cumulative log-probability of
  the node's path — are expanded, ``top_k`` of them or fewer where no more could be verified
  (``speculative_config.tree_expansions``): the head runs one row per expanded node (its token, the feature
  of its parent's row) and the node's ``top_k`` most probable tokens become its children.
- Of every node created, the ``max_nodes`` with the highest scores are verified. A path's score only falls as it
  grows, so a kept node's ancestors are kept too (ties go to the shallower node); the kept nodes are numbered
  topologically — by depth, then by creation — and each names its parent's number (0: the root).

A chain of k drafts is the tree with ``top_k = 1``, ``depth = k``, ``max_nodes = k``.

The head rows of a level attend to the head's KV of the context and of the node's expanded ancestors, which
earlier levels wrote: expansion slot ``s`` (levels in order, one slot an expanded node) is written at key index
``base + s`` of the request's sequence, and the row's ancestors are a set of earlier slots (``HeadStep`` gets
them as a bool mask over slots and turns them into the attention's tree mask). Every tensor op is batched over
requests and nothing is read back to the host, so the tree for step N+1 can be drafted while the host
schedules: its shape is fixed by :class:`TreeShape`, its contents live on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from tandem.model.attention.base import slots_for_positions
from tandem.model.forward_batch import ForwardBatch
from tandem.native.tree_expand import TreeExpandKernel, TreeState, tree_expand_kernel
from tandem.speculative_config import tree_expansions

if TYPE_CHECKING:
    from tandem.spec_decode.eagle import DraftHeadProposer

# (tokens [B, E], features [B, E, H], depths [B, E] of the expanded nodes, slots [E] of their rows,
#  ancestors [B, E] int64: bit ANC_TOP - s for each expansion slot s the row sees, its own included)
#  -> head outputs [B, E, H]
HeadStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# head outputs [M, H] -> draft-vocabulary log-probabilities [M, Vd]
LogProbs = Callable[[torch.Tensor], torch.Tensor]
# head outputs [M, H], k -> the k largest log-probabilities [M, k] and their draft ids [M, k], best first
TopK = Callable[[torch.Tensor, int], "tuple[torch.Tensor, torch.Tensor]"]
# A node's expanded ancestors are int64 bits, slot s at bit ANC_TOP - s (at most 63 slots): shifted right by
# ANC_TOP - s, a row at slot s has its ancestor a at bit s - a, the tree mask's bit for the key s - a back.
ANC_TOP = 62


@dataclass(frozen=True)
class TreeShape:
    top_k: int
    depth: int
    max_nodes: int

    def __post_init__(self) -> None:
        for name in ("top_k", "depth", "max_nodes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"tree.{name} must be a positive integer, got {getattr(self, name)!r}")
        full = self.top_k * (1 + (self.depth - 1) * self.top_k)  # nodes created expanding top_k a level
        if self.max_nodes > full:
            raise ValueError(f"tree.max_nodes {self.max_nodes}: a tree of top_k {self.top_k} and depth "
                             f"{self.depth} creates only {full} nodes")
        if self.max_nodes < self.depth:
            raise ValueError(f"tree.max_nodes {self.max_nodes} must be at least the depth {self.depth}")
        if self.max_nodes > 63 or self.expansions > 63:
            raise ValueError(f"tree: at most 63 verified nodes and 63 head rows a request (max_nodes "
                             f"{self.max_nodes}, head rows {self.expansions})")

    @property
    def level_expansions(self) -> tuple[int, ...]:
        """Nodes expanded at levels 1 .. depth - 1 (``speculative_config.tree_expansions``)."""
        return tree_expansions(self.top_k, self.depth, self.max_nodes)

    @property
    def created(self) -> int:
        """Nodes created per request: ``top_k`` on level 1, ``top_k`` children of each expanded node."""
        return self.top_k * (1 + sum(self.level_expansions))

    @property
    def expansions(self) -> int:
        """Head rows per request."""
        return sum(self.level_expansions)


class DraftTree(NamedTuple):
    tokens: torch.Tensor  # [B, N] int64 target token ids, topological order
    parents: torch.Tensor  # [B, N] int64: 0 the root, else the parent's number (1..N)
    depths: torch.Tensor  # [B, N] int64: 1 for the root's children


def expand_tree(h_root: torch.Tensor, log_probs: LogProbs, to_target: Callable[[torch.Tensor], torch.Tensor],
                head_step: HeadStep, shape: TreeShape) -> DraftTree:
    """The draft tree of every request: ``h_root`` ``[B, H]`` the head's output at each request's last
    accepted row; ``log_probs`` the head's draft-vocabulary log-probabilities of head outputs;
    ``to_target`` draft ids -> target ids; ``head_step`` one level's head rows (see :data:`HeadStep`).
    The reference, and the path off the CPU; :func:`expand_tree_native` is the same tree in a few calls."""
    batch, device = h_root.shape[0], h_root.device
    k, c_all, s_all = shape.top_k, shape.created, shape.expansions
    tok = torch.full((batch, c_all), -1, dtype=torch.int64, device=device)
    score = torch.full((batch, c_all), float("-inf"), device=device)
    parent = torch.full((batch, c_all), -1, dtype=torch.int64, device=device)  # creation index; -1: the root
    depth = torch.zeros(batch, c_all, dtype=torch.int64, device=device)
    anc = torch.zeros(batch, c_all, dtype=torch.int64, device=device)  # expanded ancestors' slots (ANC_TOP - s)
    slot_of = torch.full((batch, c_all), -1, dtype=torch.int64, device=device)  # a node's expansion slot
    h_slot = torch.zeros(batch, max(s_all, 1), h_root.shape[1], dtype=h_root.dtype, device=device)

    v, i = log_probs(h_root).topk(k, dim=-1)
    tok[:, :k], score[:, :k], depth[:, :k] = to_target(i), v.float(), 1
    level_start, created, slot_start = 0, k, 0
    for level, e in enumerate(shape.level_expansions, start=2):
        prev = torch.arange(level_start, created, device=device)
        x = prev[score[:, level_start:created].topk(e, dim=-1).indices]  # [B, e] nodes to expand
        slots = torch.arange(slot_start, slot_start + e, device=device)  # [e]
        px = parent.gather(1, x)
        from_slot = slot_of.gather(1, px.clamp(min=0))  # the parent's head row (a level-1 node's: the root's)
        feats = torch.where((px < 0).unsqueeze(2), h_root.unsqueeze(1),
                            h_slot.gather(1, from_slot.clamp(min=0).unsqueeze(2).expand(-1, -1, h_root.shape[1])))
        rows_anc = anc.gather(1, x) | torch.bitwise_left_shift(torch.ones_like(slots), ANC_TOP - slots)  # + its own
        h = head_step(tok.gather(1, x), feats, depth.gather(1, x), slots, rows_anc)  # [B, e, H]
        h_slot[:, slots] = h
        slot_of.scatter_(1, x, slots.unsqueeze(0).expand(batch, -1))
        lv, li = log_probs(h.reshape(batch * e, -1)).topk(k, dim=-1)  # [B * e, k]
        new = slice(created, created + e * k)
        tok[:, new] = to_target(li).view(batch, e * k)
        score[:, new] = (score.gather(1, x).unsqueeze(2) + lv.float().view(batch, e, k)).view(batch, e * k)
        parent[:, new] = x.repeat_interleave(k, dim=1)
        depth[:, new] = level
        anc[:, new] = rows_anc.repeat_interleave(k, dim=1)
        level_start, created, slot_start = created, created + e * k, slot_start + e
    # The verified nodes: best scores (ties to the shallower), numbered by depth then creation.
    rank = score - 1e-4 * depth.float()
    keep = rank.topk(shape.max_nodes, dim=-1).indices
    keep = keep.gather(1, (depth.gather(1, keep) * c_all + keep).argsort(dim=1))
    number = torch.zeros(batch, c_all, dtype=torch.int64, device=device)
    number.scatter_(1, keep, torch.arange(1, shape.max_nodes + 1, device=device).expand(batch, -1))
    kp = parent.gather(1, keep)
    parents = torch.where(kp < 0, 0, number.gather(1, kp.clamp(min=0)))
    return DraftTree(tok.gather(1, keep), parents, depth.gather(1, keep))


def expand_tree_native(h_root: torch.Tensor, log_probs: LogProbs, draft_map: torch.Tensor | None,
                       head_step: HeadStep, shape: TreeShape, kernel: TreeExpandKernel,
                       top_k: TopK | None = None) -> DraftTree:
    """:func:`expand_tree` on CPU tensors with the bookkeeping in ``kernel`` (``native/tree_expand.c``): a
    level is one call choosing its nodes, the head's rows and its top-k, one call recording the children; the
    verified nodes one call. ``draft_map``: the target id of each draft id (None: the identity). ``top_k``: a
    level's candidates in one call (default ``log_probs(h).topk(k)``)."""
    batch, hidden = h_root.shape
    k = shape.top_k

    def candidates(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return log_probs(h).topk(k, dim=-1) if top_k is None else top_k(h, k)  # type: ignore[return-value]

    st = TreeState(batch, shape.created, max(shape.expansions, 1))
    h_all = h_root.new_empty(batch, 1 + st.slots, hidden)  # row 0: the root's head output; 1 + s: slot s's
    h_all[:, 0] = h_root
    table = h_all.view(batch * (1 + st.slots), hidden)
    v, i = candidates(h_root)
    kernel.record(st, 0, None, v.float(), i, draft_map, 1, None)
    level_start, created, slot_start = 0, k, 0
    for level, e in enumerate(shape.level_expansions, start=2):
        x, ids, depths, src, anc = kernel.select(st, level_start, created, e, slot_start)
        slots = torch.arange(slot_start, slot_start + e)
        h = head_step(ids, table.index_select(0, src.view(-1)).view(batch, e, hidden), depths, slots, anc)
        h_all[:, 1 + slot_start : 1 + slot_start + e] = h
        lv, li = candidates(h.reshape(batch * e, -1))
        kernel.record(st, created, x, lv.float(), li, draft_map, level, anc)
        level_start, created, slot_start = created, created + e * k, slot_start + e
    return DraftTree(*kernel.finish(st, shape.max_nodes))


class TreeDrafter:
    """A draft head's trees: :func:`expand_tree` over a :class:`DraftHeadProposer`'s head, KV and backend."""

    def __init__(self, proposer: DraftHeadProposer, shape: TreeShape) -> None:
        self.proposer, self.shape = proposer, shape

    def draft(self, h_root: torch.Tensor, tables: torch.Tensor, base: torch.Tensor, root_pos: torch.Tensor,
              upper: list[int], limit: int | None = None) -> DraftTree:
        """The trees of requests whose last accepted rows' head outputs are ``h_root`` ``[B, H]``; the rest as
        :meth:`head_step` takes them."""
        step = self.head_step(tables, base, root_pos, upper, limit)
        kernel = tree_expand_kernel() if h_root.device.type == "cpu" else None
        if kernel is not None:
            return expand_tree_native(h_root, self.log_probs, self.proposer.head.draft_map, step, self.shape, kernel,
                                      self.top_k)
        return expand_tree(h_root, self.log_probs, self.to_target, step, self.shape)

    def log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary log-probabilities of head outputs ``[M, H]``."""
        return torch.log_softmax(self.proposer.head.logits(h).float(), dim=-1)

    def top_k(self, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most probable draft ids of head outputs ``h`` and their log-probabilities: one native call
        where the head has one (:meth:`NativeHeadLayer.top_k`), else :meth:`log_probs` and ``topk``."""
        native = self.proposer.native
        got = native.top_k(h, k) if native is not None else None
        return got if got is not None else self.log_probs(h).topk(k, dim=-1)  # type: ignore[return-value]

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids as target ids."""
        dmap = self.proposer.head.draft_map
        return ids if dmap is None else dmap[ids]

    def head_step(self, tables: torch.Tensor, base: torch.Tensor, root_pos: torch.Tensor, upper: list[int],
                  limit: int | None = None) -> HeadStep:
        """One tree level's head rows for requests with block tables ``tables`` ``[B, W]``: expansion slot s
        of request b is written at key index ``base[b] + s``, a node at depth d takes position
        ``root_pos[b] + d - 1`` (the row whose next token is the node), and sees the context before
        ``base[b]`` and its ancestors' slots. ``upper``: host upper bounds of ``base`` (nothing is read back).
        ``limit``: keys at or past it (``max_model_len``: no block holds them) are written to the head cache's
        trash slot."""
        prop, bs, max_slots = self.proposer, self.proposer.block_size, self.shape.expansions
        kernel = tree_expand_kernel() if tables.device.type == "cpu" else None

        def step(ids: torch.Tensor, feats: torch.Tensor, depths: torch.Tensor, slots: torch.Tensor,
                 anc: torch.Tensor) -> torch.Tensor:
            b, e = ids.shape
            if kernel is not None:  # the same rows in one call
                positions, slot_map, key1, bits, rows_tables = kernel.rows(
                    tables, base, root_pos, depths, anc, int(slots[0]), bs, limit, prop.trash_slot)
            else:
                positions, slot_map, key1, bits, rows_tables = level_rows(
                    tables, base, root_pos, depths, anc, slots, bs, limit, prop.trash_slot)
            cb = ForwardBatch(
                input_ids=ids.reshape(-1),
                positions=positions,
                slot_mapping=slot_map,
                block_tables=rows_tables,
                query_start_loc=list(range(b * e + 1)),
                seq_lens=[u + max_slots for u in upper for _ in range(e)],
                seq_lens_dev=key1,
                tree_masks=bits,
            )
            metadata = prop.backend.build_metadata(cb, bs)
            return prop._head(cb.input_ids, feats.reshape(b * e, -1), cb.positions, metadata).view(b, e, -1)

        return step


def level_rows(tables: torch.Tensor, base: torch.Tensor, root_pos: torch.Tensor, depths: torch.Tensor,
               anc: torch.Tensor, slots: torch.Tensor, block_size: int, limit: int | None, trash: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tree level's head rows for the attention (``TreeDrafter.head_step``, one attention request a row):
    positions, cache slots, sequence lengths, tree masks ``[B * e]`` and block tables ``[B * e, W]``. The
    reference of ``native/tree_expand.c``'s ``tandem_tree_rows``, and the path off the CPU."""
    e = depths.shape[1]
    key = (base.unsqueeze(1) + slots).reshape(-1)  # each row's own key index
    rows_tables = tables.repeat_interleave(e, dim=0)
    slot_map = slots_for_positions(rows_tables, key.unsqueeze(1), block_size).view(-1)
    if limit is not None:
        slot_map = torch.where(key < limit, slot_map, trash)
    # tree mask: bit (s - a) for each ancestor slot a (itself included), every key before base
    bits = torch.bitwise_right_shift(anc, ANC_TOP - slots) | torch.bitwise_left_shift(torch.full_like(slots, -1),
                                                                                      slots + 1)
    positions = (root_pos.unsqueeze(1) + depths - 1).reshape(-1)
    return positions, slot_map, key + 1, bits.reshape(-1), rows_tables
