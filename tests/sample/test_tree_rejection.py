"""Tree verification (sample/tree_rejection.py): exact greedy walks on hand-built and random trees, the
chain as a special case of the tree (draw for draw), depths, and the target's law.

The statistical assertions use the Bretagnolle-Huber-Carol bound of test_rejection_sampler.py at a failure
probability of 1e-6 each (five assertions here: a correct sampler fails with probability below 1e-5; the
seeds are fixed, so the outcome is reproducible)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from tandem.sample import make_generator, rejection_sample
from tandem.sample.tree_rejection import (
    greedy_tree_verify,
    greedy_tree_verify_rows,
    tree_depths,
    tree_rejection_sample,
)
from tests.sample.test_rejection_sampler import DELTA, DEVICES, empirical, random_dist, tv, tv_bound


def _t(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def test_greedy_follows_a_branch_that_is_not_the_first_child_at_every_depth() -> None:
    # root -> 1:5, 2:7, 3:9;  2 -> 4:3, 5:4;  5 -> 6:8, 7:2
    d = _t([[5, 7, 9, 3, 4, 8, 2]])
    parent = _t([[0, 0, 0, 2, 2, 5, 5]])
    target = _t([[7, 0, 4, 0, 0, 2, 8, 11]])  # argmax after root, node 1, ..., node 7
    out = greedy_tree_verify(target, d, parent)
    assert out.output_token_ids.tolist() == [[7, 4, 2, 11]]  # 11: the bonus after leaf 7
    assert out.accepted_nodes.tolist() == [[2, 5, 7]]
    assert out.num_accepted.tolist() == [3]


def test_greedy_recovers_at_the_first_mismatch_and_ignores_absent_nodes() -> None:
    d = _t([[5, 7, -1, 3], [5, 7, 9, 3]])
    parent = _t([[0, 0, 0, 2], [0, 0, 0, 2]])
    # request 0: root wants 9, the node that holds it is absent -> recovered 9 at once;
    # request 1: root wants 7 (node 2), node 2 wants 6 (child 4 holds 3) -> recovered 6
    target = _t([[9, 0, 6, 0, 0], [7, 0, 6, 0, 0]])
    out = greedy_tree_verify(target, d, parent)
    assert out.output_token_ids.tolist() == [[9, -1, -1], [7, 6, -1]]
    assert out.accepted_nodes.tolist() == [[-1, -1], [2, -1]]
    assert out.num_accepted.tolist() == [0, 1]


def _random_tree(rng: random.Random, n: int, vocab: int) -> tuple[list[int], list[int]]:
    parent = [rng.randrange(0, i) if i > 1 else 0 for i in range(1, n + 1)]  # node i's parent < i
    d = [rng.randrange(vocab) if rng.random() > 0.1 else -1 for _ in range(n)]
    return d, parent


def _reference_greedy(target: list[int], d: list[int], parent: list[int]) -> list[int]:
    cur, out = 0, []
    while True:
        kids = [i for i in range(1, len(d) + 1) if parent[i - 1] == cur and d[i - 1] >= 0]
        hit = next((i for i in kids if d[i - 1] == target[cur]), None)
        if hit is None:
            return out + [target[cur]]
        out.append(d[hit - 1])
        cur = hit


def test_greedy_equals_a_reference_walk_on_random_trees() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n, vocab = rng.randrange(1, 12), rng.choice([2, 3, 5])
        batch = [_random_tree(rng, n, vocab) for _ in range(4)]
        target = [[rng.randrange(vocab) for _ in range(n + 1)] for _ in batch]
        out = greedy_tree_verify(_t(target), _t([b[0] for b in batch]), _t([b[1] for b in batch]))
        for row, (d, parent), want_t in zip(out.output_token_ids.tolist(), batch, target):
            want = _reference_greedy(want_t, d, parent)
            assert row[: len(want)] == want and all(x == -1 for x in row[len(want) :])


def test_greedy_walk_on_host_lists_equals_the_tensor_walk() -> None:
    """The CPU's host-list walk (``greedy_tree_verify_rows``) gives the tensor walk's verdict: paths, accepted
    nodes and counts, on random trees with absent nodes and deep accepted branches."""
    rng = random.Random(1)
    for _ in range(300):
        n, vocab = rng.randrange(1, 12), rng.choice([2, 3, 5])
        batch = [_random_tree(rng, n, vocab) for _ in range(4)]
        target = [[rng.randrange(vocab) for _ in range(n + 1)] for _ in batch]
        d, parent = [b[0] for b in batch], [b[1] for b in batch]
        depth = int(tree_depths(_t(parent)).max())
        want = greedy_tree_verify(_t(target), _t(d), _t(parent), depth)
        got = greedy_tree_verify_rows(target, d, parent, depth)
        for a, b in zip(got, want):
            assert a.tolist() == b.tolist()


def test_depths() -> None:
    assert tree_depths(_t([[0, 0, 1, 1, 3]])).tolist() == [[1, 1, 2, 2, 3]]


@pytest.mark.parametrize("greedy", [False, True])
def test_a_chain_tree_is_the_chain_sampler_draw_for_draw(greedy: bool) -> None:
    gen = torch.Generator().manual_seed(7)
    batch, k, vocab = 64, 4, 6
    p = random_dist(batch, k + 1, vocab, gen=gen)
    # drafts: half the time the target's argmax, so that deep acceptances happen
    best = p[:, :k].argmax(-1)
    drafts = torch.where(torch.rand(batch, k, generator=gen) < 0.5, best, torch.randint(0, vocab, (batch, k), generator=gen))
    drafts[:5, 2:] = -1  # ragged
    parent = torch.arange(k).expand(batch, k).contiguous()
    keys = [1000 + b for b in range(batch)]
    mask = torch.full((batch,), greedy)
    chain = rejection_sample(p, drafts, None, [make_generator(x, "cpu") for x in keys], mask)
    tree = tree_rejection_sample(p, drafts, parent, [make_generator(x, "cpu") for x in keys], mask)
    assert torch.equal(tree.output_token_ids, chain)
    assert torch.equal(tree.num_accepted, (chain != -1).sum(1) - 1)


@pytest.mark.parametrize("device", DEVICES)
def test_the_emitted_tokens_follow_the_target(device: str) -> None:
    """One tree (2 children under the root, 2 under each, 1 under the first grandchild), 200,000 rows,
    drafts chosen without looking at the target. The first token follows p_root; the second, over rows
    that accepted a first node, follows p_root(x) p_x(y) restricted to the candidates x; the third likewise.
    The acceptance rate of the first level is p_root's mass on its candidates."""
    gen = torch.Generator().manual_seed(11)
    torch.manual_seed(11)  # unseeded rows draw from the default generator
    vocab, n = 5, 200_000
    #            1  2  3  4  5  6  7
    d = _t([[1, 3, 0, 2, 4, 1, 3]])
    parent = _t([[0, 0, 1, 1, 2, 2, 3]])
    p_rows = random_dist(8, vocab, gen=gen)  # the target after root, after node 1, ..., after node 7
    # make the candidates likely enough that every level is reached often
    p_rows = 0.5 * p_rows
    for row, cand in ((0, [1, 3]), (1, [0, 2]), (2, [4, 1]), (3, [3])):
        p_rows[row, cand] += 0.5 / len(cand)
    out = tree_rejection_sample(p_rows.expand(n, -1, -1).to(device), d.expand(n, -1).to(device),
                                parent.expand(n, -1).to(device), None, torch.zeros(n, dtype=torch.bool, device=device))
    toks = out.output_token_ids.cpu()
    assert out.output_token_ids.device.type == device
    first = empirical(toks[:, 0], vocab)
    assert tv(first, p_rows[0]) < tv_bound(n, vocab)
    rate = (toks[:, 1] != -1).double().mean().item()
    assert abs(rate - p_rows[0, [1, 3]].sum().item()) < math.sqrt(math.log(2 / DELTA) / (2 * n))
    node_of_first = {1: 1, 3: 2}  # candidate token -> node
    has2 = toks[:, 1] != -1
    pairs = toks[has2, 0] * vocab + toks[has2, 1]
    want = torch.zeros(vocab, vocab, dtype=torch.float64)
    for x, node in node_of_first.items():
        want[x] = p_rows[0, x].double() * p_rows[node].double()
    want = want.reshape(-1) / want.sum()
    assert tv(empirical(pairs, vocab * vocab), want) < tv_bound(int(has2.sum()), vocab * vocab)
    # third token after (1 via node 1, 0 via node 3): node 3's child is token 3 (node 7)
    path = has2 & (toks[:, 0] == 1) & (toks[:, 1] == 0)
    m = int(path.sum())
    assert m > 5000
    third = empirical(toks[path, 2], vocab)
    assert tv(third, p_rows[3]) < tv_bound(m, vocab)
    assert set(out.accepted_nodes.cpu()[path, :2].unique().tolist()) == {1, 3}


def test_bad_trees_are_refused() -> None:
    p = torch.full((1, 3, 4), 0.25)
    with pytest.raises(ValueError, match="parent"):
        tree_rejection_sample(p, _t([[1, 2]]), _t([[0, 2]]), None, torch.zeros(1, dtype=torch.bool))
    with pytest.raises(ValueError, match="draft_token_ids"):
        tree_rejection_sample(p, _t([[1, 2, 3]]), _t([[0, 1, 2]]), None, torch.zeros(1, dtype=torch.bool))
    with pytest.raises(ValueError, match="greedy_mask"):
        tree_rejection_sample(p, _t([[1, 2]]), _t([[0, 1]]), None, torch.zeros(2, dtype=torch.bool))
