"""Structured outputs through the OpenAI server under speculation and async scheduling (real model).

The CI-sized version of the acceptance run (``benchmarks/bench_structured.py`` runs all 50 requests
through all eight arms, see BENCHMARKS.md; in CI, ``draft_model`` and ``eagle`` are covered by the
tiny-checkpoint tests in every async mode): three requests (a person, a weather report with enums
and an array, a task through completions with vLLM's ``guided_json``; the others through chat with
``response_format``), greedy, through one ``tandem serve`` per arm: the reference (no speculation,
async off) and ``ngram`` with async on (``eagle`` with a random head passed here too, at twice the
cost). Every output is JSON that validates against its schema and every arm gives the reference's
tokens (or first differs at a proven near-tie). The reference server also checks the 400s for bad
constraints and ``json_object`` / ``guided_choice``.
"""

from __future__ import annotations

import json
import openai
import pytest

from tests.entrypoints.remote import RemoteServer
from tests.structured.serving import (
    MODEL,
    ArmRun,
    check_valid,
    run_arm,
    same_as_reference,
    select,
    spec_counts,
)

pytestmark = pytest.mark.slow
pytest.importorskip("xgrammar")

REQS = select([0, 33, 49])  # #49 goes through completions + guided_json


def _check_errors(server: RemoteServer) -> None:
    """Bad constraints are 400s naming the field; a JSON object request gives a JSON object."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "Give me JSON about a cat."}]
    bad = [
        {"response_format": {"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        {"extra_body": {"guided_regex": "(unclosed"}},
        {"extra_body": {"guided_grammar": "root ::= missing_rule"}},
        {"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a+"}},
        {"extra_body": {"structured_outputs": {"json": {"type": "object"}, "bogus": 1}}},
        {"extra_body": {"guided_choice": []}},
    ]  # fmt: skip
    for kw in bad:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=8, **kw  # type: ignore[arg-type]
            )
        assert err.value.status_code == 400
        assert "structured_outputs" in str(err.value), str(err.value)
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=48, temperature=0,  # type: ignore[arg-type]
        response_format={"type": "json_object"},
    )
    text = r.choices[0].message.content or ""
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
    else:  # a long object cut by max_tokens: still an object, not another JSON value
        assert text.lstrip().startswith("{"), text
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is the sky blue?"}],  # type: ignore[list-item]
        max_tokens=8, temperature=0, extra_body={"guided_choice": ["yes", "no"]},
    )
    assert r.choices[0].message.content in ("yes", "no")


@pytest.fixture(scope="module")
def reference() -> ArmRun:
    run = run_arm(None, False, REQS, concurrency=len(REQS), on_server=_check_errors)
    check_valid(REQS, run.results, run.label)
    return run


ARMS = [("ngram", True)]


@pytest.mark.parametrize(("spec", "async_on"), ARMS, ids=[f"{s}-async_{a}" for s, a in ARMS])
def test_schema_requests_valid_and_identical(
    reference: ArmRun, spec: str, async_on: bool
) -> None:
    run = run_arm(spec, async_on, REQS, concurrency=len(REQS))
    check_valid(REQS, run.results, run.label)
    identical = sum(
        same_as_reference(r, g, f"{run.label} #{i}")
        for (i, _), r, g in zip(REQS, reference.results, run.results)
    )
    assert identical >= len(REQS) - 1, f"{run.label}: only {identical} identical"
    assert run.metrics["vllm:num_requests_running"] == 0
    counts = spec_counts(run.metrics)
    assert counts["drafts"] + counts["invalid_spec_tokens"] > 0
    if spec == "draft_model":
        # The target as its own draft proposes exactly what the constrained target picks, except
        # where the draft (unconstrained) leaves the grammar: those drafts are cut, never rejected.
        assert counts["accepted_tokens"] == counts["draft_tokens"] > 0
        assert counts["invalid_spec_tokens"] > 0
