"""The executor-side step fan-out: rank 0's output resolves a step, any rank's failure fails every
pending step once there is more than one rank, and disagreeing sampled-token digests fail the executor."""

from __future__ import annotations

import pytest

from tandem.core.interface import ModelRunnerOutput
from tandem.distributed.fanout import RankAck, StepFanout, rank_reply, tokens_digest
from tandem.executor.base import ExecutorError


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


def test_rank_reply() -> None:
    out = _out([[1, 2]])
    assert rank_reply(out, 0, True) is out
    assert rank_reply(out, 1, False) == RankAck(1, None)
    assert rank_reply(out, 1, True) == RankAck(1, tokens_digest([[1, 2]]))
