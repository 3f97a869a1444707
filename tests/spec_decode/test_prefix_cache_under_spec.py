"""The prefix cache under speculative decoding: blocks that verify steps fill enter the cache as soon as their
tokens are confirmed (the scheduler caches every full block before the confirmed frontier after each step,
whatever computed it), so a multi-turn chat hits as much with eagle3 — async scheduling on, the default — as
without speculation. 4 conversations × 4 turns; each turn's prompt is the previous turn's prompt, its answer and
a new user message, through the chat template."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tests.helpers import humaneval_prompts

pytestmark = pytest.mark.slow

TURNS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)
FOLLOW_UPS = ["Explain it in one sentence.", "Now add a docstring.", "What is its complexity?"]


def _chat(llm: LLM) -> tuple[float, list[list[str]]]:
    """The 4-turn chats; returns the prefix-cache hit rate over turns 2-4 and every answer."""
    stats = llm.engine.core.scheduler.kv.pool.stats
    conversations = [[{"role": "user", "content": p}] for p in humaneval_prompts(4)]
    answers: list[list[str]] = [[] for _ in conversations]
    queries = hits = 0
    for turn in range(TURNS):
        before = (stats.queries, stats.hits)
        outs = llm.chat(conversations, GREEDY, use_tqdm=False)
        if turn:
            queries += stats.queries - before[0]
            hits += stats.hits - before[1]
        for conv, out, got in zip(conversations, outs, answers):
            got.append(out.outputs[0].text)
            conv.append({"role": "assistant", "content": out.outputs[0].text})
            if turn < TURNS - 1:
                conv.append({"role": "user", "content": FOLLOW_UPS[turn]})
    sched = llm.engine.core.scheduler
    assert not sched.requests and sched.kv.all_free()
    return hits / queries, answers


def test_a_multi_turn_chat_hits_the_prefix_cache_as_much_with_eagle3() -> None:
    plain = LLM(max_num_seqs=4, max_model_len=2048, num_kv_blocks=2048)
    rate, answers = _chat(plain)
    plain.shutdown()
    spec = LLM(max_num_seqs=4, max_model_len=2048, num_kv_blocks=2048,
               speculative_config={"method": "eagle3", "num_speculative_tokens": 3})
    assert spec.async_scheduling.resolved is True
    spec_rate, spec_answers = _chat(spec)
    assert spec.spec_decode_stats()["num_accepted_tokens"] > 0  # drafts were verified and kept
    spec.shutdown()
    assert rate > 0.8, rate  # every full block of the previous turn is served from the cache
    assert abs(spec_rate - rate) <= 0.01, (rate, spec_rate)
    same = sum(a == b for x, y in zip(answers, spec_answers) for a, b in zip(x, y))
    assert same >= TURNS * 4 - 2  # greedy: the same conversations (a near-tie may split one)
