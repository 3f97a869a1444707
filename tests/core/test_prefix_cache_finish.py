"""Prefix caching at a request's end and its counters (scripted fake runner, no torch): the blocks a request
completes in its final step enter the cache before its blocks are freed, and a request is counted once in
the prefix-cache counters, when it is admitted. Every test ends with all blocks free."""

from __future__ import annotations

import pytest

from tests.core.harness import assert_all_free, make_engine, make_request, run_to_completion

BS = 4


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_max_tokens_1_prompt_is_reusable(async_scheduling: bool) -> None:
    core, _ = make_engine(async_scheduling=async_scheduling, block_size=BS)
    prompt = [1 + (j * 7) % 60 for j in range(22)]  # 5 full blocks + 2 tokens
    run_to_completion(core, [make_request("first", prompt, max_tokens=1)])
    got = run_to_completion(core, [make_request("again", prompt, max_tokens=3)])
    assert got["again"].num_cached_tokens == 5 * BS  # every full block of the prompt
    assert_all_free(core)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_four_turn_chat_caches_every_full_block_of_the_previous_turn(async_scheduling: bool) -> None:
    core, _ = make_engine(async_scheduling=async_scheduling, block_size=BS)
    prompt = [1 + (j * 3) % 50 for j in range(10)]
    previous_known = 0
    for turn in range(4):
        got = run_to_completion(core, [make_request(f"t{turn}", prompt, max_tokens=7)])[f"t{turn}"]
        if turn:
            # the previous turn's prompt + answer were all computed except the last sampled token; the
            # lengths (10, 22, 34, 46 prompt tokens + 7) make each turn's last step complete a block
            assert got.num_cached_tokens == (previous_known - 1) // BS * BS
            assert (previous_known - 1) % BS == 0
        previous_known = len(prompt) + len(got.tokens)
        prompt = prompt + got.tokens + [7, 8, 9, 10, 11]  # previous prompt + answer + new user text
    assert_all_free(core)


def test_counters_count_an_admitted_request_once() -> None:
    # 8 blocks of 4: "long" holds 5-7 of them, so "head" (4 blocks) waits at the head of the queue, looked up
    # again every step, until "long" finishes
    core, _ = make_engine(async_scheduling=False, block_size=BS, num_blocks=8, max_num_seqs=4, max_model_len=32)
    shared = [1 + (j * 5) % 60 for j in range(12)]
    run_to_completion(core, [make_request("warm", shared + [3], max_tokens=1)])
    stats = core.scheduler.kv.pool.stats
    base = (stats.requests, stats.queries, stats.hits)
    long = make_request("long", shared + [4] * 8, max_tokens=6)  # 20 prompt tokens, 3 blocks cached
    head = make_request("head", [9] * 16, max_tokens=2)
    core.add_request(long)
    core.add_request(head)
    waited = 0
    while core.has_unfinished_requests():
        core.step()
        waited += head.num_cached_tokens < 0  # not admitted yet
    assert waited >= 2
    assert (long.num_cached_tokens, head.num_cached_tokens) == (12, 0)
    got = (stats.requests - base[0], stats.queries - base[1], stats.hits - base[2])
    assert got == (2, 20 + 16, 12)
    assert_all_free(core)
