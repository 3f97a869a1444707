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
    i64 = {"dtype": torch.int64, "device": device}
    row_slot_t, target_t, offset_t, tree_b_t, plan_t = torch.tensor(
        [row_slot, target_row, offset, tree_b, plan_of_row], **i64)
    is_tree = tree_b_t >= 0
    positions = torch.where(is_tree, step.base.index_select(0, plan_t) + offset_t, batch.positions.index_select(0, target_t))
    feat_rows = target_t
    if verdict is not None and verdict.accepted_nodes.shape[1]:
        nodes = verdict.accepted_nodes  # [B, D] node numbers, -1 padded
        node = nodes[tree_b_t.clamp(min=0), (offset_t - 1).clamp(min=0, max=nodes.shape[1] - 1)]
        feat_rows = target_t + torch.where(is_tree & (offset_t > 0) & (node >= 0), node, 0)
    feats = head.target_feature(hidden, prop.aux_hidden_layers).index_select(0, feat_rows)
    ids = ib.tokens[row_slot_t, (positions + 1).clamp(max=ib.trash)]
    slot_mapping = ib.block_table[row_slot_t, torch.div(positions, bs, rounding_mode="floor")] * bs + positions % bs
    qsl = list(itertools.accumulate(counts, initial=0))
    plan_slots = torch.tensor([p.slot for p in step.plans], **i64)
    width = -(-max(seq_upper) // bs)
    hb = ForwardBatch(
        input_ids=ids,
        positions=positions,
        slot_mapping=slot_mapping,
        block_tables=ib.block_table[:, :width].index_select(0, plan_slots),
        query_start_loc=qsl,
        seq_lens=seq_upper,
        seq_lens_dev=positions.index_select(0, torch.tensor(qsl[1:], **i64) - 1) + 1,
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
