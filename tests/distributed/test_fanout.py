"""The executor-side step fan-out: rank 0's output resolves a step, any rank's failure fails every
pending step once there is more than one rank, and disagreeing sampled-token digests fail the executor."""

from __future__ import annotations

import pytest
import torch

from tandem.core.interface import ModelRunnerOutput
from tandem.distributed.fanout import RankAck, StepFanout, rank_reply, tokens_digest
from tandem.executor.base import ExecutorError
from tandem.sampling_params import SamplingParams
from tandem.worker.input_prep import RequestPlan
from tandem.worker.pending import PendingStep
from tandem.worker.request_state import RequestState


def _out(tokens: list[list[int]]) -> ModelRunnerOutput:
    ids = [f"r{i}" for i in range(len(tokens))]
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=tokens)


def test_rank0_output_resolves_and_acks_are_checked() -> None:
    fan = StepFanout(2, check_lockstep=True)
    f1, f2 = fan.launch(1), fan.launch(2)
    out = _out([[5], [7, 8]])
    fan.output(1, out)
    assert f1.result() is out and not f2.done()
    fan.ack(1, RankAck(1, tokens_digest([[5], [7, 8]])))
    assert fan.steps_checked == 1 and fan.dead is None
    fan.ack(2, RankAck(1, tokens_digest([[6]])))  # rank 1 reports first, then disagrees
    fan.output(2, _out([[9]]))
    assert fan.dead is not None and "diverged at step 2" in fan.dead
    with pytest.raises(ExecutorError, match="diverged"):
        fan.launch(3).result()


def test_any_rank_failure_fails_every_pending_step() -> None:
    fan = StepFanout(2)
    f1, f2 = fan.launch(1), fan.launch(2)
    fan.step_failed(1, 1, "boom")
    for f in (f1, f2):
        with pytest.raises(ExecutorError, match="worker rank 1 failed step 1: boom"):
            f.result(timeout=1)
    fan.fail("later reason")
    assert "boom" in (fan.dead or "")  # the first reason is kept


def test_one_rank_step_failure_fails_only_that_step() -> None:
    fan = StepFanout(1)
    f1, f2 = fan.launch(1), fan.launch(2)
    fan.step_failed(1, 0, "bad input")
    with pytest.raises(ExecutorError, match="worker step failed: bad input"):
        f1.result(timeout=1)
    assert not f2.done() and fan.dead is None


def _step(tokens: list[list[int]]) -> PendingStep:
    """A runner's step result (one verify of two tokens per request), as a rank holds it before replying."""
    plans = []
    for i, _ in enumerate(tokens):
        st = RequestState(f"r{i}", i, [1, 2, 3], [], SamplingParams(), 0, [0], 3)
        plans.append(RequestPlan(st, st.req_id, i, 0, 2, 1, 1, True, True, None))
    width = max(map(len, tokens))
    sampled = torch.tensor([row + [-1] * (width - len(row)) for row in tokens])
    return PendingStep(step_id=1, req_ids=[p.req_id for p in plans], sampling=plans, sampled=sampled, drafts=None,
                       num_valid=[1] * len(plans), logprobs=None, prompt_logprobs={}, send_drafts=False)


def test_rank_reply() -> None:
    step = _step([[1, 2]])
    out = rank_reply(step, 0, True)
    assert isinstance(out, ModelRunnerOutput) and out.sampled_token_ids == [[1, 2]] and out.req_ids == ["r0"]
    assert rank_reply(step, 1, False) == RankAck(1, None)
    assert rank_reply(step, 1, True) == RankAck(1, tokens_digest([[1, 2]]))
