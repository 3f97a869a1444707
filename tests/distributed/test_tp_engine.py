"""Tensor parallelism end to end on the default model (9 query / 3 KV heads: an uneven 2 + 1 KV-group
split): two gloo ranks in ``mp`` worker processes give TP=1's greedy tokens for 16 HumanEval prompts,
async off (plain) and on (with n-gram speculation, the shipped EAGLE and EAGLE-3 heads, and suffix decoding —
each under the speculation policy, adaptive by default), and the ranks stay in lockstep (every step's sampled
tokens hashed on every rank and compared by the executor).

Five arms keep CI short; the full matrix (async on/off x none / ngram / suffix / a draft model / EAGLE /
EAGLE-3 / MTP under the speculation policy, deferred reconciliation, and the ``ray`` executor) is
``benchmarks/check_tp_tokens.py``, whose last results are in BENCHMARKS.md."""

from __future__ import annotations

import pytest

from tandem import LLM
from tests.distributed.common import GREEDY, N_PROMPTS, NGRAM, check_against_reference
from tests.helpers import humaneval_prompts

pytestmark = pytest.mark.slow

ARMS = {
    "sync": {"async_scheduling": False},
    "async-ngram": {"async_scheduling": True, "speculative_config": NGRAM},
    # A replicated EAGLE head (the shipped one): every rank gathers the whole vocabulary for it.
    "async-eagle": {
        "async_scheduling": True,
        "speculative_config": {"method": "eagle", "num_speculative_tokens": 3},
    },
    # Issue 22's learned and model-free methods: the EAGLE-3 head reads three layers' residual streams on every
    # rank; suffix decoding's index is host-side, the same on both ranks.
    "async-eagle3": {
        "async_scheduling": True,
        "speculative_config": {"method": "eagle3", "num_speculative_tokens": 3},
    },
    "async-suffix": {"async_scheduling": True, "speculative_config": {"method": "suffix"}},
}


@pytest.mark.parametrize("arm", list(ARMS))
def test_tp2_mp_matches_tp1(reference: list, arm: str) -> None:
    kw = ARMS[arm]
    llm = LLM(
        max_num_seqs=N_PROMPTS, executor_backend="mp", tensor_parallel_size=2,
        debug_invariants=True, **kw,
    )
    try:
        assert llm.async_scheduling.resolved is kw["async_scheduling"]
        outs = llm.generate(list(humaneval_prompts(N_PROMPTS)), GREEDY, use_tqdm=False)
        check_against_reference(reference, outs, f"tp2 {arm}")
        executor = llm.engine.core.executor
        assert len(executor.processes) == 2
        assert executor.lockstep_steps_checked >= GREEDY.max_tokens // 4  # every step was compared
        if "speculative_config" in kw:
            assert llm.spec_decode_stats()["num_drafts"] > 0
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
    finally:
        llm.shutdown()
