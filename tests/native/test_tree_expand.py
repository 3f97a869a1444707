"""The draft tree's bookkeeping in C (native/tree_expand.c) against the torch reference (expand_tree): the same
trees, the same head rows asked for at every level, for every tree shape the tree tests use, with and without
a draft vocabulary; and the kernel's own checks."""

from __future__ import annotations

import pytest
import torch

from tandem.native.tree_expand import TreeState, tree_expand_kernel
from tandem.spec_decode.tree_draft import (
    ANC_TOP,
    TreeShape,
    expand_tree,
    expand_tree_native,
    level_rows,
)

KERNEL = tree_expand_kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="native kernels unavailable (no C compiler)")

SHAPES = [TreeShape(1, 4, 4), TreeShape(2, 3, 6), TreeShape(3, 4, 12), TreeShape(4, 2, 20), TreeShape(2, 3, 3),
          TreeShape(3, 4, 5), TreeShape(4, 4, 16), TreeShape(2, 1, 2)]


def _head(vocab: int, seed: int):  # type: ignore[no-untyped-def]
    """A deterministic head: the hidden state a running hash of the path's tokens (3 features), the
    log-probabilities a random table's row of it; records what every level asked for."""
    table = torch.log_softmax(torch.randn(97, vocab, generator=torch.Generator().manual_seed(seed)) * 3, -1)
    calls: list[tuple[torch.Tensor, ...]] = []

    def log_probs(h: torch.Tensor) -> torch.Tensor:
        return table[h[:, 0].long() % 97]

    def step(ids, feats, depths, slots, anc):  # type: ignore[no-untyped-def]
        calls.append((ids.clone(), feats.clone(), depths.clone(), slots.clone(), anc.clone()))
        return (feats * 31 + ids.unsqueeze(2) * torch.tensor([1.0, 2.0, 3.0]) + 7) % 9973

    return log_probs, step, calls


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mapped", [False, True])
def test_native_trees_equal_the_reference(shape: TreeShape, mapped: bool) -> None:
    vocab = 13
    dmap = torch.randperm(vocab, generator=torch.Generator().manual_seed(5)) * 3 + 1 if mapped else None

    def to_target(i: torch.Tensor) -> torch.Tensor:
        return i if dmap is None else dmap[i]

    for seed in range(3):
        roots = torch.tensor([[3.0, 1.0, 2.0], [50.0, 4.0, 4.0], [8.0, 0.0, 9.0], [977.0, 5.0, 6.0]])
        lp, step, ref_calls = _head(vocab, seed)
        ref = expand_tree(roots, lp, to_target, step, shape)
        lp, step, nat_calls = _head(vocab, seed)
        nat = expand_tree_native(roots, lp, dmap, step, shape, KERNEL)
        for a, b in zip(ref, nat):
            assert torch.equal(a, b), (shape, seed, ref, nat)
        assert len(ref_calls) == len(nat_calls) == len(shape.level_expansions)
        for rc, nc in zip(ref_calls, nat_calls):  # tokens, features, depths, slots and ancestors of every row
            for a, b in zip(rc, nc):
                assert torch.equal(a, b)


def test_ties_go_to_the_earlier_node_and_the_shallower_rank() -> None:
    """A flat distribution: every candidate scores the same, so the order is the tie rule's alone."""
    shape = TreeShape(2, 3, 4)

    def log_probs(h: torch.Tensor) -> torch.Tensor:
        return torch.full((h.shape[0], 5), -1.0)

    def step(ids, feats, depths, slots, anc):  # type: ignore[no-untyped-def]
        return feats

    tree = expand_tree_native(torch.zeros(1, 2), log_probs, None, step, shape, KERNEL)
    # level 1: two nodes; level 2 expands both, level 3 the first two children (those of the first node);
    # the four best ranks: the two at depth 1, then the first two at depth 2
    assert tree.depths.tolist() == [[1, 1, 2, 2]]
    assert tree.parents.tolist() == [[0, 0, 1, 1]]


def test_calls_check_their_inputs() -> None:
    st = TreeState(2, 6, 2)
    with pytest.raises(ValueError, match="tree select"):
        KERNEL.select(st, 0, 2, 3, 0)  # 3 of 2 nodes
    with pytest.raises(ValueError, match="tree select"):
        KERNEL.select(st, 0, 2, 2, 1)  # past the slots
    with pytest.raises(ValueError, match="tree record"):
        KERNEL.record(st, 0, None, torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.int64),
                      None, 1, None)
    with pytest.raises(ValueError, match="tree record"):
        KERNEL.record(st, 5, None, torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.int64), None, 1, None)
    with pytest.raises(ValueError, match="tree finish"):
        KERNEL.finish(st, 7)
    # a draft id outside the map is clamped into it, never read past it
    dmap = torch.tensor([10, 11, 12])
    KERNEL.record(st, 0, None, torch.zeros(2, 2), torch.tensor([[-4, 1], [2, 99]]), dmap, 1, None)
    assert st.tok[:, :2].tolist() == [[10, 11], [12, 12]]


@pytest.mark.parametrize("limit", [None, 40])
def test_native_head_rows_equal_the_reference(limit: int | None) -> None:
    """A level's head rows for the attention (positions, slots, lengths, tree masks, tables), against the
    torch ops: keys across block boundaries, past the table (its last column), at or past the limit (the
    trash slot), ancestors at several slots."""
    gen = torch.Generator().manual_seed(3)
    tables = torch.randint(0, 50, (3, 4), generator=gen)
    base = torch.tensor([5, 30, 58])  # request 2's keys run past its 4 blocks of 16
    root_pos = base - 1
    for slot0, e in ((0, 2), (2, 3), (60, 3)):
        depths = torch.randint(1, 5, (3, e), generator=gen)
        slots = torch.arange(slot0, slot0 + e)
        own = torch.bitwise_left_shift(torch.ones_like(slots), ANC_TOP - slots)
        anc = own | torch.bitwise_left_shift(torch.ones(3, e, dtype=torch.int64), ANC_TOP - torch.randint(0, max(slot0, 1), (3, e), generator=gen))
        ref = level_rows(tables, base, root_pos, depths, anc, slots, 16, limit, 999)
        mine = KERNEL.rows(tables, base, root_pos, depths, anc, slot0, 16, limit, 999)
        for a, b in zip(ref, mine):
            assert torch.equal(a, b), (slot0, a, b)
    with pytest.raises(ValueError, match="tree rows"):
        KERNEL.rows(tables, base, root_pos, depths, anc, 62, 16, limit, 999)  # slots past 63


def test_native_tree_masks_equal_the_reference() -> None:
    """Every tree row's mask (worker/tree_step.py's tree_bits) in one call: trees of every test shape,
    chains, and the padded columns store_trees adds (parent 0, a depth past every level)."""
    from tandem.worker.tree_step import tree_bits

    for shape in SHAPES:
        lp, step, _ = _head(13, 1)
        tree = expand_tree(torch.tensor([[3.0, 1.0, 2.0], [50.0, 4.0, 4.0]]), lp, lambda i: i, step, shape)
        for parents, depths in ((tree.parents, tree.depths),
                                (torch.cat([tree.parents, torch.zeros(2, 3, dtype=torch.int64)], 1),
                                 torch.cat([tree.depths, torch.full((2, 3), shape.depth + 1)], 1)),
                                (torch.cat([tree.parents, torch.zeros(2, 3, dtype=torch.int64)], 1),
                                 torch.cat([tree.depths, torch.full((2, 3), shape.depth + 2)], 1))):
            assert torch.equal(KERNEL.bits(parents, depths), tree_bits(parents, depths)), shape
    chain = torch.arange(5).expand(3, -1), torch.arange(1, 6).expand(3, -1)
    assert torch.equal(KERNEL.bits(*chain), tree_bits(*chain))
    with pytest.raises(ValueError, match="tree bits"):
        KERNEL.bits(torch.zeros(1, 64, dtype=torch.int64), torch.ones(1, 64, dtype=torch.int64))


def test_native_head_pass_rows_equal_the_reference() -> None:
    """The head's pass over a tree step (tree_propose.head_rows): accepted paths of several lengths (nodes
    accepted at some depths, -1 past the count), a prefill chunk's and a decode's plain rows, positions across
    block boundaries and at the token table's last column (the trash); then an out-of-range row is refused."""
    from tandem.spec_decode.tree_propose import head_rows

    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 1000, (4, 40), generator=gen)  # column 39: the trash
    table = torch.randint(0, 30, (4, 5), generator=gen)
    batch_positions = torch.tensor([14, 15, 16, 17, 3, 4, 5, 38, 31, 32, 33, 34])
    base = torch.tensor([14, 3, 38, 31])  # plans: a tree verify, a prefill chunk, a decode, a tree verify
    nodes = torch.tensor([[2, 3, -1], [1, -1, -1]])  # the verdict's rows: plans 0 and 3
    meta = [[2] * 4 + [0] * 3 + [1] + [3] * 3,  # slots
            [0] * 4 + [4, 5, 6] + [7] + [8] * 3,  # target rows: a path's root row, plain rows
            [0, 1, 2, 3] + [0, 0, 0] + [0] + [0, 1, 2],  # offsets on the accepted paths
            [0] * 4 + [-1] * 3 + [-1] + [1] * 3,  # the verdict's row
            [0] * 4 + [1] * 3 + [2] + [3] * 3]  # plans
    for nd in (nodes, None, nodes[:, :0]):
        ref = head_rows(meta, base, batch_positions, nd, tokens, table, 8)
        mine = KERNEL.head_rows(meta, base, batch_positions, nd, tokens, table, 8)
        for a, b in zip(ref, mine):
            assert torch.equal(a, b), (nd, a, b)
    assert mine[0].tolist()[7] == 38 and mine[1].tolist()[7] == tokens[1, 39]  # the trash column
    bad = [list(v) for v in meta]
    bad[1][0] = 12  # a target row past the batch
    with pytest.raises(ValueError, match="tree head rows"):
        KERNEL.head_rows(bad, base, batch_positions, nodes, tokens, table, 8)
    bad = [list(v) for v in meta]
    bad[2][3] = 30  # a position past the block table
    with pytest.raises(ValueError, match="tree head rows"):
        KERNEL.head_rows(bad, base, batch_positions, nodes, tokens, table, 8)
