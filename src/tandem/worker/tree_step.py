"""The runner's tree steps (``speculative_config.tree``): verifying each request's draft tree, moving the accepted
branch's K/V into place, and storing the next trees in the persistent batch. Device ops only; every shape is
known on the host (``max_nodes`` nodes a tree, depth ``num_speculative_tokens``).

A request that verifies k > 0 slots feeds its root and all ``N`` nodes (``input_prep``); nodes deeper than k
are fed but never accepted (the scheduler's k bounds what the ledgers count: placeholders, the frontier's
advance and its roll-back are a chain's of k drafts). The verdict is the longest accepted path plus one token
(:mod:`tandem.sample.tree_rejection`), padded like the chain sampler's ``[B, k + 1]`` output, so committing it is
the chain's commit. Its nodes' K/V rows, written at keys ``frontier + node``, move to ``frontier + 1 ..``
before anything reads them; the draft head's K/V needs no move (the proposer runs the head over the accepted
path again, ``tree_propose``).
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

import torch

from tandem.native.tree_expand import tree_expand_kernel
from tandem.sample.metadata import to_device
from tandem.sample.sampler import LogprobsTensors, compute_logprobs
from tandem.sample.tree_rejection import (
    TreeVerdict,
    greedy_tree_verify,
    greedy_tree_verify_rows,
    tree_rejection_sample,
)
from tandem.spec_decode.eagle import DraftHeadProposer
from tandem.spec_decode.tree_draft import DraftTree, TreeDrafter, TreeShape
from tandem.spec_decode.tree_propose import propose_tree

if TYPE_CHECKING:
    from tandem.model.forward_batch import KVCache
    from tandem.model.transformer import CausalLM
    from tandem.sample import Sampler, SamplingMetadata
    from tandem.spec_decode.proposer import Proposer
    from tandem.speculative_config import TreeConfig
    from tandem.worker.input_batch import InputBatch
    from tandem.worker.input_prep import RequestPlan, StepInputs


def tree_bits(parents: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """Every tree row's ``ForwardBatch.tree_masks`` entry ``[B, N + 1]`` (row 0 the root) from the nodes'
    ``parents`` and ``depths`` ``[B, N]`` (numbered by depth): the root sees every key before it (all bits);
    row j sees itself (bit 0) and what its parent p sees, ``j - p`` keys further back. One op per level."""
    batch, n = parents.shape
    bits = torch.full((batch, n + 1), -1, dtype=torch.int64, device=parents.device)
    if not n:
        return bits
    own = torch.arange(1, n + 1, device=parents.device).expand(batch, -1)
    for level in range(1, int(n) + 1):
        at = depths == level
        if level > 1 and not bool(at.any()):
            break
        from_parent = torch.bitwise_left_shift(bits.gather(1, parents), own - parents) | 1
        bits[:, 1:] = torch.where(at, from_parent, bits[:, 1:])
    return bits


def store_trees(ib: InputBatch, slots: torch.Tensor, tree: DraftTree) -> None:
    """The next trees of the requests in ``slots``: tokens as their drafts, parents, depths and row masks. A
    smaller tree (a chain) fills the first columns; the rest are nodes no verify accepts (below every depth)."""
    tokens, parents, depths = tree
    batch, n = tokens.shape
    width = ib.tree_parents.shape[1]
    if n < width:
        pad = (batch, width - n)
        tokens = torch.cat([tokens, tokens.new_full(pad, -1)], dim=1)
        parents = torch.cat([parents, parents.new_zeros(pad)], dim=1)
        depths = torch.cat([depths, depths.new_full(pad, ib.drafts.shape[1] + 1)], dim=1)
    ib.drafts[slots, :width] = tokens
    ib.tree_parents[slots] = parents
    ib.tree_depths[slots] = depths
    kernel = tree_expand_kernel() if parents.device.type == "cpu" and width <= 63 else None
    ib.tree_bits[slots] = kernel.bits(parents, depths) if kernel is not None else tree_bits(parents, depths)


def verify_trees(sampler: Sampler, logits: torch.Tensor, meta: SamplingMetadata, plans: list[RequestPlan],
                 ib: InputBatch, depth: int) -> TreeVerdict:
    """The verdict of every sampling request: ``logits`` holds each plan's sample rows in order (one row for a
    request without slots, root + N nodes for a tree verify). Seeds: the generator of a request's first row,
    as for the chain."""
    device = logits.device
    counts = [len(p.sample_rows) for p in plans]
    starts = list(accumulate(counts, initial=0))[:-1]
    n = max(counts) - 1  # the nodes any request fed: N with a tree verify, a chain's k without one
    slots = torch.tensor([p.slot for p in plans], dtype=torch.int64, device=device)
    if meta.all_greedy and device.type == "cpu":  # the walk on host lists (the same decisions as below)
        ids = sampler.greedy_token_ids(logits, meta).tolist()
        tables = torch.stack([ib.tree_parents.index_select(0, slots)[:, :n], ib.tree_depths.index_select(0, slots)[:, :n],
                              ib.drafts.index_select(0, slots)[:, :n]]).tolist()
        targets, tokens_l = [], []
        for b, (p, s, c) in enumerate(zip(plans, starts, counts)):
            targets.append([ids[s + min(j, c - 1)] for j in range(n + 1)])
            tokens_l.append([t if dep <= p.num_slots else -1 for t, dep in zip(tables[2][b], tables[1][b])])
        return greedy_tree_verify_rows(targets, tokens_l, tables[0], depth)
    last = torch.tensor(counts, dtype=torch.int64, device=device).unsqueeze(1) - 1
    index = torch.tensor(starts, dtype=torch.int64, device=device).unsqueeze(1) + torch.minimum(
        torch.arange(n + 1, device=device), last)  # [B, N + 1]: a request without a tree repeats its one row
    k = torch.tensor([p.num_slots for p in plans], dtype=torch.int64, device=device).unsqueeze(1)
    parents = ib.tree_parents.index_select(0, slots)[:, :n]
    depths = ib.tree_depths.index_select(0, slots)[:, :n]
    tokens = torch.where(depths <= k, ib.drafts.index_select(0, slots)[:, :n], -1)
    if meta.all_greedy:
        return greedy_tree_verify(sampler.greedy_token_ids(logits, meta)[index], tokens, parents, depth)
    probs = sampler.compute_probs(logits, meta)[index]  # [B, N + 1, V]
    greedy = [meta.is_greedy[s] for s in starts]
    return tree_rejection_sample(probs, tokens, parents, meta.generators(starts), to_device(greedy, torch.bool, device),
                                 depth)


def move_accepted(kv: KVCache, ib: InputBatch, plans: list[RequestPlan], base: torch.Tensor,
                  verdict: TreeVerdict) -> None:
    """Each request's accepted nodes' K/V rows (keys ``base + known - 1 + node``) to the sequence's next keys
    (``base + known + i``), in every layer; pairs past the accepted count copy a row onto itself. ``base``: the
    plans' frontiers before the step (``StepInputs.base`` at their indices)."""
    nodes = verdict.accepted_nodes  # [B, D], -1 padded
    if not nodes.shape[1]:
        return
    device = nodes.device
    slots = torch.tensor([p.slot for p in plans], dtype=torch.int64, device=device)
    root = base + torch.tensor([p.num_known - 1 for p in plans], dtype=torch.int64, device=device)
    kv.move_branches(ib.block_table, slots, root, nodes)


class TreeSteps:
    """The runner's tree steps: one per runner, over its persistent batch, KV cache and sampler."""

    def __init__(self, drafter: TreeDrafter, kv: KVCache, max_model_len: int) -> None:
        self.drafter, self.kv, self.max_model_len = drafter, kv, max_model_len
        self.depth = drafter.shape.depth
        # the chain the speculation policy may choose instead, drafted and verified by the same machinery
        self.chain = TreeDrafter(drafter.proposer, TreeShape(1, self.depth, self.depth))
        self.num_nodes = drafter.shape.max_nodes
        self.batch: InputBatch | None = None  # the runner's (set once it exists)
        self.sampler: Sampler | None = None

    @classmethod
    def create(cls, tree: TreeConfig, model: CausalLM, proposer: Proposer | None, kv: KVCache, depth: int,
               max_model_len: int) -> TreeSteps:
        if not isinstance(proposer, DraftHeadProposer):
            raise ValueError("speculative_config.tree needs a draft head (methods eagle, eagle3, mtp)")
        if any(layer.sliding for layer in model.layers):
            raise ValueError("speculative_config.tree: tree steps do not support sliding-window layers")
        return cls(TreeDrafter(proposer, TreeShape(tree.top_k, depth, tree.max_nodes)), kv, max_model_len)

    def verify(self, plans: list[RequestPlan], logits: torch.Tensor, meta: SamplingMetadata
               ) -> tuple[TreeVerdict, LogprobsTensors | None]:
        """Every sampling request's verdict (``logits``: its sample rows, in order; a request without slots: its
        one sampled token) and, where a request asks for them (never one that verifies a tree: the scheduler
        gives it no slots), the logprobs of its token."""
        assert self.batch is not None and self.sampler is not None
        verdict = verify_trees(self.sampler, logits, meta, plans, self.batch, self.depth)
        lp = None
        if meta.max_num_logprobs is not None:
            counts = torch.tensor([len(p.sample_rows) for p in plans], device=logits.device)
            lp = compute_logprobs(logits, verdict.output_token_ids[:, 0].repeat_interleave(counts),
                                  meta.max_num_logprobs)
        return verdict, lp

    def move_accepted(self, step: StepInputs, verdict: TreeVerdict) -> None:
        assert self.batch is not None
        if not any(p.tree for p in step.sampling):
            return  # chains only: an accepted node is already at its key
        base = step.base.index_select(0, torch.tensor(step.sampling_index, device=step.base.device))
        move_accepted(self.kv, self.batch, step.sampling, base, verdict)

    def store_chains(self, plans: list[RequestPlan], drafts: torch.Tensor) -> None:
        """Chains the chain proposer drafted (``[B, k]``, -1 padded) as trees, for the next step's verify."""
        assert self.batch is not None
        batch, k = drafts.shape
        device = drafts.device
        parents = torch.arange(k, device=device).expand(batch, -1)
        depths = torch.arange(1, k + 1, device=device).expand(batch, -1)
        slots = torch.tensor([p.slot for p in plans], dtype=torch.int64, device=device)
        store_trees(self.batch, slots, DraftTree(drafts, parents.contiguous(), depths.contiguous()))

    def propose(self, step: StepInputs, fwd: object, verdict: TreeVerdict | None, num_drafts: int | None,
                trees: bool = True) -> torch.Tensor:
        """The head's pass and the next trees (``tree_propose``; ``trees`` False: chains, the policy's choice),
        stored in the batch; returns the drafts ``[B, N]`` of the sampling requests (-1 where none were
        drafted). ``num_drafts`` None: a decode-only step that drafts nothing; the head does not run (as for
        chains)."""
        assert self.batch is not None
        ib, plans = self.batch, step.sampling
        tree = None
        if num_drafts is not None:
            prop = self.drafter.proposer
            hidden = {-1: fwd.hidden_states}  # type: ignore[attr-defined]
            for layer, h in zip(prop.aux_hidden_layers, fwd.aux_hidden_states):  # type: ignore[attr-defined]
                hidden[layer] = h
            drafter = self.drafter if trees else self.chain
            tree = propose_tree(drafter, step, ib, hidden, verdict, num_drafts, self.max_model_len)
        slots = torch.tensor([p.slot for p in plans], dtype=torch.int64, device=ib.drafts.device)
        if tree is None:
            drafts = torch.full((len(plans), self.num_nodes), -1, dtype=torch.int64, device=ib.drafts.device)
            ib.set_drafts(slots, drafts)
            return drafts
        store_trees(ib, slots, tree)
        return ib.drafts.index_select(0, slots)
