"""Draft trees (spec_decode/tree_draft.py) and the reference tree-speculation loop (tree_reference.py): the
tree's order and parents, the chain as a tree, and — on tiny targets with EAGLE, EAGLE-3 and MTP heads —
greedy outputs through trees identical to plain greedy decoding and to the engine's."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.spec_decode.tree_draft import ANC_TOP, DraftTree, TreeShape, expand_tree
from tandem.spec_decode.tree_reference import generate
from tests.spec_decode.tiny_heads import add_mtp, tiny_target, write_eagle, write_eagle3

V = 261


def test_shapes_are_validated() -> None:
    assert TreeShape(2, 3, 6).created == 2 + 2 * 4 and TreeShape(2, 3, 6).expansions == 4
    # small trees expand fewer nodes where no more could be verified: the best min(top_k, max_nodes - d)
    assert TreeShape(2, 3, 3).level_expansions == (2, 1) and TreeShape(2, 3, 3).created == 2 + 2 * 3
    assert TreeShape(3, 4, 5).level_expansions == (3, 3, 2)
    with pytest.raises(ValueError, match="at least the depth"):
        TreeShape(2, 3, 2)
    with pytest.raises(ValueError, match="max_nodes"):
        TreeShape(1, 3, 4)
    with pytest.raises(ValueError, match="top_k"):
        TreeShape(0, 3, 1)
    with pytest.raises(ValueError, match="63"):
        TreeShape(4, 20, 60)  # 76 head rows a request


def _synthetic(vocab: int, seed: int):  # type: ignore[no-untyped-def]
    """A deterministic 'head' for the algorithm alone: the hidden state is a running hash of the path's
    tokens, the log-probabilities a fixed random table row of it."""
    table = torch.log_softmax(torch.randn(97, vocab, generator=torch.Generator().manual_seed(seed)) * 3, -1)
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def log_probs(h: torch.Tensor) -> torch.Tensor:
        return table[h[:, 0].long() % 97]

    def step(ids, feats, depths, slots, anc):  # type: ignore[no-untyped-def]
        calls.append((slots.clone(), anc.clone()))
        return (feats * 31 + ids.unsqueeze(2) + 7) % 9973

    return log_probs, step, calls


SHAPES = [TreeShape(1, 4, 4), TreeShape(2, 3, 6), TreeShape(3, 4, 12), TreeShape(4, 2, 20), TreeShape(2, 3, 3),
          TreeShape(3, 4, 5)]


@pytest.mark.parametrize("shape", SHAPES)
def test_trees_are_topological_ancestor_closed_and_best_first(shape: TreeShape) -> None:
    log_probs, step, calls = _synthetic(11, seed=shape.top_k)
    h_root = torch.tensor([[3.0], [50.0], [8.0]])
    tree = expand_tree(h_root, log_probs, lambda i: i, step, shape)
    assert tree.tokens.shape == tree.parents.shape == (3, shape.max_nodes)
    assert [len(slots) for slots, _ in calls] == list(shape.level_expansions)
    for slots, anc in calls:  # each row sees its own slot and only earlier ones (slot s: bit ANC_TOP - s)
        assert ((anc >> (ANC_TOP - slots)) & 1).bool().all()
        assert not (anc & ((1 << (ANC_TOP - int(slots.max()))) - 1)).any()
    for b in range(3):
        parents, depths = tree.parents[b].tolist(), tree.depths[b].tolist()
        for n, (par, d) in enumerate(zip(parents, depths), start=1):
            assert 0 <= par < n, "a parent comes before its child"
            assert d == (1 if par == 0 else depths[par - 1] + 1)
        assert depths == sorted(depths)
    if shape.top_k == 1:  # a chain: each draft the argmax after the one before
        h = h_root
        for j in range(shape.depth):
            tok = log_probs(h).argmax(-1)
            assert torch.equal(tree.tokens[:, j], tok)
            h = (h * 31 + tok.unsqueeze(1) + 7) % 9973


def _path_scores(tree: DraftTree, b: int, h0: float, log_probs) -> list[float]:  # type: ignore[no-untyped-def]
    """The synthetic head's cumulative log-probability of each verified node's path (request ``b``)."""
    h = {0: torch.tensor([[h0]])}
    score = {0: 0.0}
    for n, (tok, par) in enumerate(zip(tree.tokens[b].tolist(), tree.parents[b].tolist()), start=1):
        score[n] = score[par] + float(log_probs(h[par])[0, tok])
        h[n] = (h[par] * 31 + tok + 7) % 9973
    return [score[n] for n in range(1, len(score))]


def _full_expansion(h0: float, log_probs, top_k: int, depth: int, max_nodes: int) -> list[float]:  # type: ignore[no-untyped-def]
    """EAGLE-2's tree expanding ``top_k`` nodes on every level, by brute force: its verified nodes' scores."""
    level = [(0.0, torch.tensor([[h0]]))]
    nodes: list[tuple[float, int]] = []  # (score, depth)
    for d in range(1, depth + 1):
        children = []
        for sc, h in sorted(level, key=lambda n: -n[0])[: top_k if d > 1 else 1]:
            lp = log_probs(h)[0]
            for tok in lp.topk(top_k).indices.tolist():
                children.append((sc + float(lp[tok]), (h * 31 + tok + 7) % 9973))
        nodes += [(sc, d) for sc, _ in children]
        level = children
    return [sc for sc, _ in sorted(nodes, key=lambda n: -(n[0] - 1e-4 * n[1]))[:max_nodes]]


@pytest.mark.parametrize("shape", SHAPES)
def test_fewer_expansions_never_verify_a_worse_tree(shape: TreeShape) -> None:
    """Against the tree that expands ``top_k`` nodes on every level: where nothing is pruned the same verified
    scores; where fewer nodes are expanded, verified scores at least as high, rank by rank."""
    for seed in range(4):
        log_probs, step, _ = _synthetic(11, seed=seed)
        roots = [3.0, 50.0, 8.0, 977.0]
        tree = expand_tree(torch.tensor([[r] for r in roots]), log_probs, lambda i: i, step, shape)
        for b, h0 in enumerate(roots):
            mine = sorted(_path_scores(tree, b, h0, log_probs), reverse=True)
            full = sorted(_full_expansion(h0, log_probs, shape.top_k, shape.depth, shape.max_nodes), reverse=True)
            if shape.expansions == (shape.depth - 1) * shape.top_k:
                assert mine == pytest.approx(full, abs=1e-5)
            else:
                assert all(m >= f - 1e-5 for m, f in zip(mine, full)), (mine, full)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("tree")
    target = tiny_target(tmp)
    d2t = torch.arange(120) * 1
    return {
        "target": target,
        "eagle": ({"method": "eagle", "model": str(write_eagle(tmp / "eagle", V))}, target),
        "eagle3": ({"method": "eagle3", "model": str(write_eagle3(tmp / "eagle3", V, 120, d2t=d2t, layer_ids=[1, 2, 3]))},
                   target),
        "mtp": ({"method": "mtp"}, add_mtp(tiny_target(tmp / "m"))),
    }


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_tree_speculation_emits_exactly_the_greedy_tokens(setup: dict[str, Any], method: str) -> None:
    spec, target = setup[method]
    llm = LLM(str(target), max_num_seqs=2, speculative_config={**spec, "num_speculative_tokens": 3})
    runner = llm.engine.core.executor.runner
    model, proposer = runner.model, runner.proposer
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for text in ("the " * 12, "abc abc abc", "hello there"):
        prompt = tok.encode(text)
        engine = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
        plain = generate(model, proposer, prompt, 40, None).tokens
        assert plain == list(engine)
        for shape in (TreeShape(1, 3, 3), TreeShape(2, 3, 3), TreeShape(2, 3, 6), TreeShape(3, 4, 10)):
            run = generate(model, proposer, prompt, 40, shape)
            assert run.tokens == plain, (method, text, shape)
            assert all(1 <= n <= shape.depth + 1 for n in run.accepted_lengths)
    llm.shutdown()


def test_accepted_branches_off_the_first_child_keep_the_cache_exact(setup: dict[str, Any]) -> None:
    """Trees whose right path is the last child at every depth (decoys first): every step accepts up to 3
    nodes that are not first children, so each step moves K/V rows; the outputs stay the greedy ones only if
    every moved row equals what a sequential forward would have written (the acceptance check's KV test in
    its strongest form: all later tokens depend on it)."""
    spec, target = setup["eagle"]
    llm = LLM(str(target), max_num_seqs=2, speculative_config={**spec, "num_speculative_tokens": 3})
    runner = llm.engine.core.executor.runner
    prompt = llm.get_tokenizer().encode("the quick brown fox")
    plain = generate(runner.model, runner.proposer, prompt, 60, None).tokens
    truth = prompt + plain

    def oracle(context: list[int]) -> DraftTree:
        nxt = truth[len(context) : len(context) + 3] + [0, 0, 0]
        c1, c2, c3 = nxt[:3]
        decoy = [(t + 1) % V for t in (c1, c2, c3)]
        # 1: decoy, 2: decoy, 3: c1 (root);  4: decoy, 5: c2 (under 3);  6: decoy, 7: c3 (under 5)
        tokens = [decoy[0], (c1 + 2) % V, c1, decoy[1], c2, decoy[2], c3]
        parents, depths = [0, 0, 0, 3, 3, 5, 5], [1, 1, 1, 2, 2, 3, 3]
        return DraftTree(*(torch.tensor([x]) for x in (tokens, parents, depths)))

    run = generate(runner.model, runner.proposer, prompt, 60, TreeShape(2, 3, 6), oracle=oracle)
    assert run.tokens == plain
    assert run.accepted_lengths.count(4) >= 10, run.accepted_lengths  # three nodes accepted, rows moved
    llm.shutdown()
