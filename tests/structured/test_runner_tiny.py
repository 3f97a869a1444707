"""Structured outputs through the whole engine on a tiny random checkpoint (seconds, no real model).

Two regexes alternate over the batch. The first forces alternating "ab"/"ba" pairs and a final "c";
the prompt repeats "abx", so the n-gram proposer keeps drafting an "x" that the grammar refuses. The
second is one line of 6 to 16 printable ASCII characters: some drafts of the random EAGLE head fit
it and are verified (and rejected by the masked target), the rest are cut. Cut drafts are counted.
Greedy tokens are identical with and without speculation (n-gram, the target as its own draft,
EAGLE), async off, on and deferred; random sampling (seeded) stays inside the grammar; a KV cache too
small for the batch preempts requests mid-generation, which resume with a rebuilt matcher and give
the unpreempted tokens.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tandem import SamplingParams
from tests.structured.tiny import arms, generate, make_tiny

transformers = pytest.importorskip("transformers")
pytest.importorskip("xgrammar")

REGEXES = (r"(ab|ba){2,5}c", r"[ -~]{6,16}\n")
PROMPTS = ["abx abx abx ab", "the cat sat on the mat abx", "ba ba ba abx ab", "hello there"] * 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_tiny(tmp_path_factory.mktemp("tiny"))


def _params(temperature: float = 0.0) -> list[SamplingParams]:
    return [
        SamplingParams(
            temperature=temperature, seed=i, max_tokens=24,
            structured_outputs={"regex": REGEXES[i % 2]},
        )
        for i in range(len(PROMPTS))
    ]


def _check_grammar(outs: list) -> None:
    for i, o in enumerate(outs):
        assert re.fullmatch(REGEXES[i % 2], o.text), (i, o.text)


def _run(model: Path, params: list[SamplingParams], **kw: Any) -> tuple[list, dict, int]:
    outs, stats, preemptions = generate(model, PROMPTS, params, **kw)
    return [o.outputs[0] for o in outs], stats, preemptions


@pytest.fixture(scope="module")
def greedy_reference(tiny: dict[str, Any]) -> list:
    outs, _, _ = _run(tiny["target"], _params(), async_scheduling=False)
    _check_grammar(outs)
    assert all(o.finish_reason == "stop" for o in outs)
    return outs


@pytest.mark.parametrize(
    "arm", ["nospec-async", "ngram-sync", "ngram-async", "ngram-deferred", "eagle-sync",
            "eagle-async", "eagle-deferred"],
)  # fmt: skip
def test_greedy_identical_and_invalid_drafts_counted(
    tiny: dict[str, Any], greedy_reference: list, arm: str
) -> None:
    outs, stats, _ = _run(tiny["target"], _params(), **arms(tiny)[arm])
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy_reference]
    if arm != "nospec-async":
        assert stats["num_drafts"] > 0
        assert stats["num_invalid_spec_tokens"] > 0


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_invalid_drafts_same_count_async_off_and_on(tiny: dict[str, Any], method: str) -> None:
    params = _params()
    counts = [
        _run(tiny["target"], params, **arms(tiny)[f"{method}-{mode}"])[1]
        for mode in ("sync", "deferred")
    ]
    assert counts[0] == counts[1]


@pytest.mark.parametrize("arm", ["ngram-sync", "eagle-async"])
def test_random_sampling_stays_in_grammar(tiny: dict[str, Any], arm: str) -> None:
    outs, _, _ = _run(tiny["target"], _params(temperature=1.0), **arms(tiny)[arm])
    _check_grammar(outs)


@pytest.mark.parametrize("arm", ["ngram-async", "eagle-deferred", "draft-async"])
def test_preemption_mid_generation_resumes_grammar(
    tiny: dict[str, Any], greedy_reference: list, arm: str
) -> None:
    # 12 blocks of 4 tokens for 4 concurrent requests of ~25 tokens: preemption all the time, with
    # outputs and drafts in flight. A resumed request rebuilds its matcher from its outputs.
    kw = arms(tiny)[arm] | {"num_kv_blocks": 12, "block_size": 4, "max_model_len": 48}
    outs, stats, preemptions = _run(tiny["target"], _params(), **kw)
    assert preemptions > 0
    assert stats["num_drafts"] > 0
    _check_grammar(outs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy_reference]


def test_draft_model_as_its_own_draft(tiny: dict[str, Any], greedy_reference: list) -> None:
    outs, stats, _ = _run(tiny["target"], _params(), **arms(tiny)["draft-async"])
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy_reference]
    # Valid drafts are exactly the constrained target's choices; the rest were cut, not rejected.
    assert stats["num_accepted_tokens"] == stats["num_draft_tokens"]
    assert stats["num_invalid_spec_tokens"] > 0
