"""Tree speculation in the engine (speculative_config.tree; worker/tree_step.py, spec_decode/tree_propose.py):
the rows' attention bits, the accepted branch's K/V move, and end to end on tiny targets with EAGLE, EAGLE-3
and MTP heads — greedy outputs identical to no speculation with async scheduling off and on, including trees
whose right path is never the first child (every step moves K/V rows), and seeded sampling reproducible."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.model.paged_batch import tree_bits as host_tree_bits
from tandem.spec_decode.tree_draft import DraftTree
from tandem.speculative_config import SpeculativeConfig
from tandem.worker.tree_step import tree_bits
from tests.spec_decode.tiny_heads import add_mtp, tiny_target, write_eagle, write_eagle3

V = 261
TREE = {"top_k": 2, "max_nodes": 6}
PROMPTS = ["the " * 12, "abc abc abc", "hello there", "the quick brown fox jumps"]


def test_row_bits_equal_the_host_rule() -> None:
    rng = random.Random(0)
    for n in (1, 5, 16, 40, 63):
        parents, depths = [], []
        for j in range(1, n + 1):
            par = rng.randrange(0, j)
            parents.append(par)
            depths.append(1 if par == 0 else depths[par - 1] + 1)
        order = sorted(range(n), key=lambda i: depths[i])  # number by depth, as trees are
        new = {old + 1: pos + 1 for pos, old in enumerate(order)}
        new[0] = 0
        p = [new[parents[i]] for i in order]
        d = [depths[i] for i in order]
        got = tree_bits(torch.tensor([p]), torch.tensor([d]))[0].tolist()
        assert got == host_tree_bits(p), n


def test_the_engine_plan_shows_the_tree(setup: dict[str, Any]) -> None:
    import json

    from tandem.engine.builder import plan_engine
    from tandem.engine.llm import config_from_kwargs

    spec, target, _ = setup["eagle"]
    cfg = config_from_kwargs(str(target), speculative_config={**spec, "num_speculative_tokens": 3, "tree": TREE})
    shown = json.loads(json.dumps(plan_engine(cfg, log=False).as_dict()))  # `tandem config --json`
    assert shown["speculative_config"]["tree"] == TREE


def test_tree_config_is_validated() -> None:
    with pytest.raises(ValueError, match="draft head"):
        SpeculativeConfig.from_any({"method": "ngram", "num_speculative_tokens": 3, "tree": TREE})
    with pytest.raises(ValueError, match="creates only"):
        SpeculativeConfig.from_any({"method": "eagle", "num_speculative_tokens": 2, "tree": {"top_k": 2, "max_nodes": 7}})
    with pytest.raises(ValueError, match="'top_k' and 'max_nodes'"):
        SpeculativeConfig.from_any({"method": "eagle", "num_speculative_tokens": 3, "tree": {"top_k": 2}})


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("tree_steps")
    target = tiny_target(tmp)
    d2t = torch.arange(120) * 1
    base = LLM(str(target), max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    greedy = [list(o.outputs[0].token_ids) for o in base.generate(PROMPTS, params)]
    tok = base.get_tokenizer()
    base.shutdown()
    mtp_target = add_mtp(tiny_target(tmp / "m"))
    base = LLM(str(mtp_target), max_num_seqs=4)
    mtp_greedy = [list(o.outputs[0].token_ids) for o in base.generate(PROMPTS, params)]
    base.shutdown()
    return {
        "params": params,
        "tok": tok,
        "eagle": ({"method": "eagle", "model": str(write_eagle(tmp / "eagle", V))}, target, greedy),
        "eagle3": ({"method": "eagle3", "model": str(write_eagle3(tmp / "eagle3", V, 120, d2t=d2t,
                                                                  layer_ids=[1, 2, 3]))}, target, greedy),
        "mtp": ({"method": "mtp"}, mtp_target, mtp_greedy),
    }


def _llm(spec: dict[str, Any], target: Any, async_scheduling: bool, **kw: Any) -> LLM:
    cfg = {**spec, "num_speculative_tokens": 3, "tree": TREE, "policy": "fixed"}
    return LLM(str(target), max_num_seqs=4, async_scheduling=async_scheduling, speculative_config=cfg, **kw)


def _check_idle(llm: LLM) -> None:
    core = llm.engine.core
    assert core.scheduler.kv.all_free()
    assert not core.scheduler.requests


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_tree_outputs_equal_greedy(setup: dict[str, Any], method: str, async_scheduling: bool) -> None:
    spec, target, greedy = setup[method]
    llm = _llm(spec, target, async_scheduling)
    out = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, setup["params"])]
    assert out == greedy
    assert llm.spec_decode_stats()["num_drafts"] > 0  # trees were verified
    _check_idle(llm)
    llm.shutdown()


def _oracle(llm: LLM, truths: list[list[int]], narrow: bool = False) -> None:
    """Replace the head's trees (the head still runs) by trees whose right path is the *last* child at every
    depth, decoys before it: each step then accepts up to three nodes that are not first children, so their
    K/V rows move. Requests are told apart by their block tables."""
    steps = llm.engine.core.executor.runner.tree
    original = steps.drafter.draft
    ib = llm.engine.core.executor.runner.batch

    def draft(h_root, tables, base, root_pos, upper, limit=None):  # type: ignore[no-untyped-def]
        tree = original(h_root, tables, base, root_pos, upper, limit)
        tokens, parents, depths = [], [], []
        for b in range(tables.shape[0]):
            slot = int(((ib.block_table == tables[b]).all(dim=1)).nonzero()[0])
            root = int(base[b])
            context = ib.tokens[slot, : root + 1].tolist()
            # (async scheduling runs steps past a request's end, which the scheduler then drops: no truth there)
            truth = next((t for t in truths if t[: root + 1] == context), [])
            c1, c2, c3 = (truth[root + 1 : root + 4] + [0, 0, 0])[:3]
            decoy = [(t + 1) % V for t in (c1, c2, c3)]
            if narrow:  # as many nodes as levels, yet not a chain: 1: decoy, 2: c1 (root), 3: c2 (under 2)
                tokens.append([decoy[0], c1, c2])
                parents.append([0, 0, 2])
                depths.append([1, 1, 2])
                continue
            # 1: decoy, 2: c1 (root);  3: decoy, 4: c2 (under 2);  5: decoy, 6: c3 (under 4)
            tokens.append([decoy[0], c1, decoy[1], c2, decoy[2], c3])
            parents.append([0, 0, 2, 2, 4, 4])
            depths.append([1, 1, 2, 2, 3, 3])
        dev = tree.tokens.device
        return DraftTree(*(torch.tensor(x, dtype=torch.int64, device=dev) for x in (tokens, parents, depths)))

    steps.drafter.draft = draft  # type: ignore[method-assign]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_branches_off_the_first_child_move_kv_exactly(setup: dict[str, Any], async_scheduling: bool) -> None:
    """Outputs stay the greedy ones only if every moved K/V row equals what a sequential forward writes (all
    later tokens attend to it); chunked prefill (a small token budget) mixes prompt chunks into tree steps."""
    spec, target, greedy = setup["eagle"]
    llm = _llm(spec, target, async_scheduling, max_num_batched_tokens=24)
    tok = setup["tok"]
    truths = [tok.encode(p) + g for p, g in zip(PROMPTS, greedy)]
    _oracle(llm, truths)
    out = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, setup["params"])]
    assert out == greedy
    stats = llm.spec_decode_stats()
    assert stats["mean_acceptance_length"] > 3.0, stats  # three nodes accepted in most steps: rows moved
    _check_idle(llm)
    llm.shutdown()


def test_a_tree_with_as_many_nodes_as_levels_still_moves_kv(setup: dict[str, Any]) -> None:
    """top_k 2, 3 nodes, depth 3: the tree has the rows of a chain but is not one; its accepted nodes still move."""
    spec, target, greedy = setup["eagle"]
    cfg = {**spec, "num_speculative_tokens": 3, "tree": {"top_k": 2, "max_nodes": 3}, "policy": "fixed"}
    llm = LLM(str(target), max_num_seqs=4, speculative_config=cfg)
    tok = setup["tok"]
    _oracle(llm, [tok.encode(p) + g for p, g in zip(PROMPTS, greedy)], narrow=True)
    out = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, setup["params"])]
    assert out == greedy
    assert llm.spec_decode_stats()["mean_acceptance_length"] > 2.5  # two nodes accepted, off the first child
    _check_idle(llm)
    llm.shutdown()


def test_seeded_sampling_is_reproducible_and_history_bound_requests_get_no_drafts(setup: dict[str, Any]) -> None:
    spec, target, _ = setup["eagle"]
    sampled = SamplingParams(temperature=0.8, seed=7, max_tokens=32, ignore_eos=True)
    penalized = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, repetition_penalty=1.3)
    base = LLM(str(target), max_num_seqs=4)
    want_pen = list(base.generate(PROMPTS[:1], penalized)[0].outputs[0].token_ids)
    base.shutdown()
    outs = []
    for async_scheduling in (False, True):
        llm = _llm(spec, target, async_scheduling)
        outs.append([list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, sampled)])
        before = llm.spec_decode_stats()["num_drafts"]
        assert list(llm.generate(PROMPTS[:1], penalized)[0].outputs[0].token_ids) == want_pen
        assert llm.spec_decode_stats()["num_drafts"] == before  # penalties: no tree for that request
        _check_idle(llm)
        llm.shutdown()
    assert outs[0] == outs[1]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_steps_drafting_trees_and_chains_mix_exactly(setup: dict[str, Any], async_scheduling: bool) -> None:
    """The adaptive policy chooses per step whether the drafts are trees or chains; here its choice is made to
    cycle (tree, chain, chain), so batches verify trees (oracle trees: they accept, rows move) beside chains (the
    tiny head's), and the outputs stay the greedy ones. (The choice itself: tests/core/test_spec_policy.py.)"""
    spec, target, _ = setup["eagle"]
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    base = LLM(str(target), max_num_seqs=4)
    ref = [list(o.outputs[0].token_ids) for o in base.generate(PROMPTS, params)]
    base.shutdown()
    cfg = {**spec, "num_speculative_tokens": 3, "tree": TREE, "policy": "adaptive"}
    llm = LLM(str(target), max_num_seqs=4, async_scheduling=async_scheduling, speculative_config=cfg)
    tok = setup["tok"]
    _oracle(llm, [tok.encode(p) + g for p, g in zip(PROMPTS, ref)])
    choice = itertools.cycle([True, False, False])
    llm.engine.core.scheduler.spec_policy._trees_pay = lambda limits, want: next(choice)  # type: ignore[method-assign]
    steps = llm.engine.core.executor.runner.tree
    calls = {"tree": 0, "chain": 0}
    for name, drafter in (("tree", steps.drafter), ("chain", steps.chain)):
        def counted(*a: Any, _inner: Any = drafter.draft, _name: str = name, **kw: Any) -> DraftTree:
            calls[_name] += 1
            return _inner(*a, **kw)

        drafter.draft = counted  # type: ignore[method-assign]
    store_chains = steps.store_chains  # chains after chains: the chain proposer's, stored as chain trees

    def counted_chains(*a: Any) -> None:
        calls["chain"] += 1
        store_chains(*a)

    steps.store_chains = counted_chains  # type: ignore[method-assign]
    out = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
    assert out == ref
    assert calls["tree"] > 5 and calls["chain"] > 5, calls
    _check_idle(llm)
    llm.shutdown()
