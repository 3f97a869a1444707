"""KV cache groups on a sliding-window model through the engine (a tiny random Gemma 3: window 8, two global and
two window layers, 4-token blocks, so every prompt reaches far past the window): greedy tokens equal
transformers' in every way of running — batched, chunked prefill, a second run served from the prefix cache,
preemption forced by a small pool, async scheduling, ngram speculation — while the window group holds only the
blocks its window can still see, and everything is free afterwards."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.core.request import Request
from tests.spec_decode.tiny_heads import tiny_gemma_target

transformers = pytest.importorskip("transformers")

MAX_TOKENS = 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
BLOCK = 4


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gemma_target(tmp_path_factory.mktemp("swa"))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 250) for _ in range(n)] for n in (41, 9, 66, 23, 100, 57)]


@pytest.fixture(scope="module")
def reference(target: Path, prompts: list[list[int]]) -> list[list[int]]:
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                              do_sample=False, pad_token_id=260)
            out.append(ids[0, len(p):].tolist())
    return out


def _run(target: Path, prompts: list[list[int]], **kwargs: Any) -> tuple[list[list[int]], LLM]:
    kwargs.setdefault("max_model_len", 160)
    llm = LLM(str(target), block_size=BLOCK, debug_invariants=True, **kwargs)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], llm


def _done(llm: LLM) -> None:
    sched = llm.engine.core.scheduler
    assert sched.kv.all_free() and not sched.requests
    llm.shutdown()


@pytest.mark.parametrize(
    "label,kwargs",
    [
        ("batched", {"max_num_seqs": 6}),
        ("chunked", {"max_num_seqs": 6, "max_num_batched_tokens": 16}),
        ("async", {"max_num_seqs": 6, "async_scheduling": True}),
        ("ngram", {"max_num_seqs": 6, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}),
        ("preempted", {"max_num_seqs": 6, "num_kv_blocks": 36, "max_model_len": 120}),
    ],
)
def test_greedy_equals_transformers(target: Path, prompts: list, reference: list, label: str, kwargs: dict) -> None:
    got, llm = _run(target, prompts, **kwargs)
    assert got == reference, label
    if label == "preempted":
        assert llm.engine.core.scheduler.counters.num_preemptions > 0
    _done(llm)


def test_prefix_cache_serves_a_windowed_model_and_keeps_its_tokens(
    target: Path, prompts: list, reference: list
) -> None:
    llm = LLM(str(target), block_size=BLOCK, max_model_len=256, max_num_seqs=1, debug_invariants=True)
    first = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in first] == reference
    assert [list(o.outputs[0].token_ids) for o in again] == reference
    # Every full block of each prompt but the last token's is served again, window groups included.
    for p, o in zip(prompts, again):
        assert o.num_cached_tokens == (len(p) - 1) // BLOCK * BLOCK
    _done(llm)


def test_window_groups_hold_only_what_the_window_sees(target: Path) -> None:
    """A 200-token request: group 0 (global layers) holds every block; once past its prefill (one chunk, which
    needs every block at once) the window group holds at most its window's blocks plus the one being filled,
    the lookback's and those of the step still in flight; at the end everything is free."""
    llm = LLM(str(target), block_size=BLOCK, max_model_len=256, max_num_seqs=1, debug_invariants=True)
    core = llm.engine.core
    kv = core.scheduler.kv
    assert kv.group_windows == (0, 8)
    prompt = list(range(3, 203))
    core.add_request(Request("long", prompt, GREEDY.clone(max_tokens=30), seed=0))
    held = []
    while core.has_unfinished_requests():
        core.step()
        req = core.scheduler.requests.get("long")
        if req is not None and req.num_computed_tokens > len(prompt) + 2:
            assert len(req.block_ids) >= req.num_computed_tokens // BLOCK  # group 0 keeps everything
            held.append(len([b for b in req.group_block_ids[0] if b != kv._null.block_id]))  # noqa: SLF001
    assert held and max(held) <= kv.blocks_needed(8 + kv.lookback) + 3, held
    assert kv.all_free()
    llm.shutdown()
