"""A draft head's step in an engine that drafts trees (``speculative_config.tree``): the head's pass over the
step's rows, then the next tree of every request that sampled (:mod:`tandem.spec_decode.tree_draft`).

The head pass is the chain proposer's (each row: the token after it, the target's feature at it), with one
difference: a request that verified a tree gives the head its *accepted path* — its root row and the rows of
the accepted nodes, at the sequence's positions ``frontier .. frontier + k`` (rows past the accepted count
carry the root's feature and whatever tokens follow; their K/V lies past the new frontier and is written over
before anything reads it) — not the tree's rows. So the head's K/V stays the K/V of the sequence and needs no
move. Every other request's rows (prefill chunks, plain decodes) are the target's rows. Shapes are the host's:
``1 + k`` rows a tree verify, whatever it accepted; the accepted count and nodes are read on the device.

The next tree grows from the head's output at the last accepted row of each sampling request; its expansion
rows are written at keys from the new root on (``TreeDrafter``; keys at or past ``max_model_len`` go to the
head cache's trash block).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from tandem.model.forward_batch import ForwardBatch
from tandem.native.tree_expand import tree_expand_kernel
from tandem.spec_decode.tree_draft import DraftTree, TreeDrafter

if TYPE_CHECKING:
    from tandem.sample.tree_rejection import TreeVerdict
    from tandem.worker.input_batch import InputBatch
    from tandem.worker.input_prep import StepInputs


def propose_tree(drafter: TreeDrafter, step: StepInputs, ib: InputBatch, hidden: dict[int, torch.Tensor],
                 verdict: TreeVerdict | None, num_drafts: int, max_model_len: int) -> DraftTree | None:
    """Run the head over the step's rows (its K/V kept current) and, when ``num_drafts`` > 0, draft the next
    tree of every request of ``step.sampling`` (None otherwise). ``verdict``: the step's tree verification, its
    rows in ``step.sampling`` order (None: no request verified a tree)."""
    prop = drafter.proposer
    head, batch, bs = prop.head, step.batch, prop.block_size
    device = batch.input_ids.device
    sampling_row = {id(p): b for b, p in enumerate(step.sampling)}
    row_slot, target_row, offset, tree_b, counts, seq_upper = [], [], [], [], [], []
    plan_of_row: list[int] = []
    root_in_segment: list[int] = []  # per sampling plan: its last known row within its head segment
    for i, p in enumerate(step.plans):
        b = sampling_row.get(id(p), -1)
        if p.samples and p.num_slots and verdict is not None:  # a verify (tree or chain): its accepted path
            n = 1 + p.num_slots
            target_row += [p.row_start + p.num_known - 1] * n
            offset += range(n)
            tree_b += [b] * n
        else:
            n = p.num_tokens
            target_row += range(p.row_start, p.row_start + n)
            offset += [0] * n
            tree_b += [-1] * n
        seq_upper.append(batch.seq_lens[i])  # (for a tree verify an upper bound: its rows reached further)
        if b >= 0:
            root_in_segment.append(p.sample_rows[0] - p.row_start)
        row_slot += [p.slot] * n
        plan_of_row += [i] * n
        counts.append(n)
    nodes = verdict.accepted_nodes if verdict is not None else None
    meta = [row_slot, target_row, offset, tree_b, plan_of_row]
    kernel = tree_expand_kernel() if device.type == "cpu" else None
    rows = (head_rows if kernel is None else kernel.head_rows)(meta, step.base, batch.positions, nodes, ib.tokens,
                                                               ib.block_table, bs)
    positions, ids, slot_mapping, feat_rows, seq_lens = rows
    feats = head.target_feature(hidden, prop.aux_hidden_layers).index_select(0, feat_rows)
    qsl = list(itertools.accumulate(counts, initial=0))
    i64 = {"dtype": torch.int64, "device": device}
    plan_slots = torch.tensor([p.slot for p in step.plans], **i64)
    width = -(-max(seq_upper) // bs)
    hb = ForwardBatch(
        input_ids=ids,
        positions=positions,
        slot_mapping=slot_mapping,
        block_tables=ib.block_table[:, :width].index_select(0, plan_slots),
        query_start_loc=qsl,
        seq_lens=seq_upper,
        seq_lens_dev=seq_lens,
    )
    h = prop._head(hb.input_ids, feats, hb.positions, prop.backend.build_metadata(hb, bs))
    if num_drafts == 0 or not step.sampling:
        return None
    # Each sampling request's last accepted row in the head batch: a tree verify's root row plus its count.
    seg_start = [qsl[i] for i, p in enumerate(step.plans) if id(p) in sampling_row]
    last = torch.tensor([s + r for s, r in zip(seg_start, root_in_segment)], **i64)
    if verdict is not None:
        tree_plan = torch.tensor([bool(p.num_slots) for p in step.sampling], dtype=torch.bool, device=device)
        last = last + torch.where(tree_plan, verdict.num_accepted, 0)
    slots = torch.tensor([p.slot for p in step.sampling], **i64)
    root = ib.num_tokens.index_select(0, slots) - 1  # the last sampled token: the next tree's root
    upper = [batch.seq_lens[i] for i, p in enumerate(step.plans) if id(p) in sampling_row]
    tables = ib.block_table.index_select(0, slots)
    return drafter.draft(h.index_select(0, last), tables, root, root, upper, limit=max_model_len)


def head_rows(meta: list[list[int]], base: torch.Tensor, batch_positions: torch.Tensor, nodes: torch.Tensor | None,
              tokens: torch.Tensor, table: torch.Tensor, block_size: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head pass's rows (:func:`propose_tree`; the reference of ``native/tree_expand.c``'s
    ``tandem_tree_head_rows``, and the path off the CPU). ``meta``: per row its request's slot, its target row,
    its offset on its plan's accepted path, its request's index among the verdict's rows (-1: not an accepted
    path) and its plan; ``base`` ``[P]`` the plans' frontiers before the step; ``batch_positions`` the target
    rows' positions; ``nodes`` the verdict's accepted nodes ``[Bv, D]`` (-1 padded); ``tokens`` / ``table`` the
    persistent batch's tokens (last column: the trash) and block tables. Returns each row's position, token (the
    one after its position), K/V slot and feature row (an accepted node's own target row), and each plan's
    sequence length (its last row's position + 1)."""
    row_slot, target, offset, tree_b, plan = torch.tensor(meta, dtype=torch.int64, device=base.device)
    is_tree = tree_b >= 0
    positions = torch.where(is_tree, base.index_select(0, plan) + offset, batch_positions.index_select(0, target))
    feat_rows = target
    if nodes is not None and nodes.shape[1]:
        node = nodes[tree_b.clamp(min=0), (offset - 1).clamp(min=0, max=nodes.shape[1] - 1)]
        feat_rows = target + torch.where(is_tree & (offset > 0) & (node >= 0), node, 0)
    ids = tokens[row_slot, (positions + 1).clamp(max=tokens.shape[1] - 1)]
    slot_mapping = table[row_slot, torch.div(positions, block_size, rounding_mode="floor")] * block_size + positions % block_size
    last = {p: r for r, p in enumerate(meta[4])}  # each plan's last row
    seq_lens = positions.index_select(0, torch.tensor([last[p] for p in range(len(last))], dtype=torch.int64,
                                                      device=base.device)) + 1
    return positions, ids, slot_mapping, feat_rows, seq_lens
