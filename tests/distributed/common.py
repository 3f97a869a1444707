"""Shared by the end-to-end tensor-parallel tests: the workload and the comparison with TP=1."""

from __future__ import annotations

from tandem import SamplingParams
from tests.helpers import assert_greedy_match

N_PROMPTS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


def check_against_reference(reference: list, outs: list, label: str) -> None:
    identical = sum(
        assert_greedy_match(r.token_ids, r.logprobs, o.outputs[0].token_ids, label=f"{label} #{i}")
        for i, (r, o) in enumerate(zip(reference, outs))
    )
    assert identical >= N_PROMPTS - 2, f"{label}: only {identical} of {N_PROMPTS} identical"
