"""Input preparation under async scheduling with a host-side drafter: draft slots the proposer left empty are
not fed (no rows), the filled ones are, and outputs stay those of no speculation."""

from __future__ import annotations

import pytest

import tandem.worker.model_runner as model_runner
from tandem import LLM, SamplingParams
from tests.helpers import humaneval_prompts

PARAMS = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_empty_placeholder_slots_are_not_fed(monkeypatch, method):
    prompts = list(humaneval_prompts(6))
    ref = LLM(max_num_seqs=6, async_scheduling=False)
    want = [o.outputs[0].token_ids for o in ref.generate(prompts, PARAMS, use_tqdm=False)]
    ref.shutdown()

    seen = {"scheduled": 0, "fed": 0, "steps_compacted": 0}
    real = model_runner.prepare_inputs

    def spy(so, ib, **kw):
        # The drafts this step verifies, as the proposer left them in the step before (read before the step).
        drafts = {rid: ib.drafts[ib.reqs[rid].slot].tolist() for rid, s in so.scheduled_spec_decode_tokens.items()
                  if s and rid in ib.reqs}
        step = real(so, ib, **kw)
        compacted = False
        for p in step.plans:
            scheduled = len(so.scheduled_spec_decode_tokens.get(p.req_id, ()))
            if not scheduled:
                continue
            assert so.scheduled_spec_decode_tokens[p.req_id][0] == -1  # async: placeholders
            filled = 0
            while filled < scheduled and drafts[p.req_id][filled] >= 0:
                filled += 1
            assert p.num_slots == filled and p.num_tokens == p.num_known + filled
            assert len(p.sample_rows) == filled + 1
            seen["scheduled"] += scheduled
            seen["fed"] += filled
            compacted |= filled < scheduled
        assert step.batch.num_tokens == sum(p.num_tokens for p in step.plans)
        seen["steps_compacted"] += compacted
        return step

    monkeypatch.setattr(model_runner, "prepare_inputs", spy)
    llm = LLM(max_num_seqs=6, async_scheduling=True, debug_invariants=True,
              speculative_config={"method": method, "num_speculative_tokens": 3, "policy": "fixed"})
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
    stats = llm.spec_decode_stats()
    sched = llm.engine.core.scheduler
    assert sched.kv.all_free() and not sched.requests
    llm.shutdown()
    assert got == want
    assert seen["steps_compacted"] > 0 and 0 < seen["fed"] < seen["scheduled"]
    assert stats["num_draft_tokens"] == seen["fed"]  # every fed slot held a draft and was verified
