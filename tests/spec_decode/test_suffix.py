"""Suffix decoding (spec_decode/suffix.py): the bounded-depth suffix index, drafting from the request's own
tokens and from earlier requests' outputs, its limits, and the engine on the real default model (greedy
outputs equal to no speculation, async off and on)."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tandem.config import SpeculativeConfig
from tandem.spec_decode.suffix import SuffixIndex, SuffixProposer
from tandem.v1.metrics.reader import Histogram
from tandem.worker.request_state import RequestState
from tests.helpers import humaneval_prompts


def _proposer(k: int = 4, depth: int = 8, cached: int = 2, factor: float = 4.0, min_prob: float = 0.1):
    return SuffixProposer(k, depth, cached, factor, min_prob)


def _state(rid: str, prompt: list[int], output: list[int] = ()) -> RequestState:
    return RequestState(rid, 0, list(prompt), list(output), SamplingParams(), 0, [], 0)


def test_index_counts_and_uncounts():
    idx = SuffixIndex(depth=3)
    seq = [5, 6, 7, 5, 6, 8]
    idx.add(seq, 0)
    p = _proposer(depth=3)
    # After (5, 6): 7 once, 8 once; after (7, 5, 6) only 8.
    assert p.draft(idx, [1, 5, 6], 1) in ([7], [8])
    assert p.draft(idx, [7, 5, 6], 1) == [8]
    idx.add(seq, 0, sign=-1)
    assert len(idx) == 0


def test_drafts_repeat_the_requests_own_text_longest_context_first():
    p = _proposer()
    st = _state("a", [1, 2, 3, 4, 9, 9, 1, 2, 3])
    assert p.propose_one(st, 4) == [4, 9, 9, 1]
    # A longer context overrides a more frequent shorter one: after (8, 2) comes 7, after 2 mostly 3.
    st = _state("b", [2, 3, 2, 3, 2, 3, 8, 2, 7, 0, 8, 2])
    assert p.propose_one(st, 1) == [7]


def test_limits_spec_factor_and_min_probability():
    st = _state("a", [1, 2, 3, 4, 5, 6, 1, 2])
    assert _proposer().propose_one(st, 2) == [3, 4]  # the request's limit
    assert _proposer(factor=0.5).propose_one(_state("a", [1, 2, 3, 4, 5, 6, 1, 2]), 4) == [3]  # 0.5 x match of 2
    # After 1: 2, 3, 4, 5 equally often -> each 1/4 < min_token_prob 0.3: nothing drafted.
    assert _proposer(min_prob=0.3).propose_one(_state("c", [1, 2, 1, 3, 1, 4, 1, 5, 1]), 3) == []
    assert _proposer().propose_one(_state("d", [1, 2, 3]), 3) == []  # nothing seen before


def test_outputs_of_finished_requests_draft_for_new_ones_bounded():
    p = _proposer(cached=1)
    done = _state("done", [50, 51], [10, 11, 12, 13, 14])
    p.propose_one(done, 0)
    p.remove_requests({"done"})
    assert p.propose_one(_state("new", [7, 10, 11]), 3) == [12, 13, 14]
    other = _state("other", [60], [20, 21, 22])
    p.propose_one(other, 0)
    p.remove_requests({"other"})  # one cached request at most: "done" leaves the global index
    assert p.propose_one(_state("new2", [7, 10, 11]), 3) == []
    assert p.propose_one(_state("new3", [20, 21]), 3) == [22]


def test_config_keys_are_vllms():
    cfg = SpeculativeConfig.from_any({"method": "suffix", "num_speculative_tokens": 4,
                                      "suffix_decoding_max_tree_depth": 16, "suffix_decoding_min_token_prob": 0.2})
    assert cfg.suffix_decoding_max_tree_depth == 16 and cfg.suffix_decoding_max_cached_requests == 256
    with pytest.raises(ValueError, match="suffix_decoding_min_token_prob"):
        SpeculativeConfig("suffix", 3, suffix_decoding_min_token_prob=1.5)
    with pytest.raises(ValueError, match="suffix_decoding_max_tree_depth"):
        SpeculativeConfig("suffix", 3, suffix_decoding_max_tree_depth=0)
    # as vLLM: without num_speculative_tokens, suffix decoding drafts up to its tree depth (24 by default)
    assert SpeculativeConfig.from_any({"method": "suffix"}).num_speculative_tokens == 24
    shallow = SpeculativeConfig.from_any({"method": "suffix", "suffix_decoding_max_tree_depth": 12})
    assert shallow.num_speculative_tokens == 12
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig.from_any({"method": "ngram"})
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be an integer in \[1, 32\]"):
        SpeculativeConfig("suffix", 33)


@pytest.mark.slow
def test_greedy_equals_no_spec_async_off_and_on(tmp_path):
    prompts = [p + p[-200:] for p in humaneval_prompts(4)]  # repeated text: the suffix index has matches
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ref = LLM(max_num_seqs=4, async_scheduling=False)
    want = [o.outputs[0].token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    ref.shutdown()
    for async_on in (False, True):
        llm = LLM(max_num_seqs=4, async_scheduling=async_on, debug_invariants=True, trace_file=str(tmp_path / "t.json"),
                  speculative_config={"method": "suffix", "num_speculative_tokens": 4})
        assert llm.async_scheduling.resolved is async_on
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert got == want
        stats = llm.spec_decode_stats()
        assert stats["num_accepted_tokens"] > 0 and stats["policy"]["policy"] == "adaptive"
        # The policy's choices are visible: in the trace (drafts scheduled, drafts asked for) and as a histogram.
        spans = [s for s in llm.engine.tracer.spans if s.name == "schedule" and "propose_k" in s.args]
        assert spans and all(0 <= s.args["propose_k"] <= 4 for s in spans)
        hist = next(m for m in llm.get_metrics() if m.name == "tandem:spec_decode_verified_drafts_per_step")
        assert isinstance(hist, Histogram) and hist.count == sum(stats["policy"]["verified_k"]) > 0
        assert hist.sum == stats["num_draft_tokens"]
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
        llm.shutdown()


@pytest.mark.slow
def test_the_index_follows_steps_that_draft_nothing():
    """Where the policy asks for no drafts, the runner still hands suffix decoding the committed tokens
    (``follow``): its index catches up with every token as it comes, so a later step that drafts pays no
    backlog (a whole prompt's: ~1.5 ms for 200 tokens, which an exploration would otherwise charge to drafting)."""
    llm = LLM(max_num_seqs=1, async_scheduling=True,
              speculative_config={"method": "suffix", "num_speculative_tokens": 3, "policy": "fixed"})
    policy, runner = llm.engine.core.scheduler.spec_policy, llm.engine.core.executor.runner
    policy.k = policy.propose_k = 0  # the fixed policy asking for no drafts, ever
    suffix = runner.proposer.inner
    seen = []
    real = suffix.follow

    def follow(states):
        real(states)
        seen.extend((st.proposer_state["suffix_index"][1], len(st.prompt_token_ids) + len(st.output_token_ids))
                    for st in states)

    suffix.follow = follow
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    out = llm.generate(humaneval_prompts(1), params, use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 12 and llm.spec_decode_stats()["num_draft_tokens"] == 0
    assert len(seen) >= 11 and all(indexed == tokens for indexed, tokens in seen)  # caught up at every step
    sched = llm.engine.core.scheduler
    assert sched.kv.all_free() and not sched.requests
    llm.shutdown()


def test_the_requests_own_continuation_outweighs_other_requests():
    """At a context both indexes have seen, the request's own continuation counts ``OWN_WEIGHT`` times: seen
    once there, it outvotes another continuation seen in two earlier requests' outputs (summed plainly, the
    earlier requests' would win)."""
    p = _proposer(cached=4)
    for rid in ("x", "y"):
        done = _state(rid, [90], [40, 41, 42, 43])
        p.propose_one(done, 0)
        p.remove_requests({rid})
    new = _state("new", [40, 41, 50, 51, 7, 40, 41])  # its own text: after (40, 41) comes 50
    assert p.propose_one(new, 2) == [50, 51]
