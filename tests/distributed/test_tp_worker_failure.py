"""Tensor parallelism: killing either rank's worker process mid-generation fails every live request
with a clear error within seconds, marks the engine failed, and shutdown does not hang — even though
the surviving rank may be blocked in a collective with the dead one."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tandem import LLM, SamplingParams
from tandem.core.request import Request
from tandem.engine.llm import EngineDeadError
from tandem.executor.base import ExecutorError

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("rank,async_on", [(1, True), (0, False)])
def test_killed_rank_fails_requests_fast(rank: int, async_on: bool) -> None:
    llm = LLM(
        max_num_seqs=4, executor_backend="mp", tensor_parallel_size=2, async_scheduling=async_on
    )
    core, tok = llm.engine.core, llm.tokenizer
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for i in range(4):
        core.add_request(Request(f"r{i}", tok.encode(f"def f{i}():"), params, seed=i))
    for _ in range(3):
        core.step()
    os.kill(core.executor.processes[rank].pid, signal.SIGKILL)
    t0 = time.monotonic()
    failed: dict[str, str] = {}
    while core.has_unfinished_requests() and time.monotonic() - t0 < 30:
        for out in core.step():
            if out.finish_reason == "error":
                failed[out.req_id] = out.error or ""
    assert time.monotonic() - t0 < 10
    assert set(failed) == {f"r{i}" for i in range(4)}
    # The dead rank is named, even when the surviving rank's broken collective reports first.
    assert all(f"worker process died (rank {rank}, exit code -9)" in e for e in failed.values()), failed
    assert core.failed is not None
    assert not core.scheduler.requests and core.scheduler.kv.all_free()
    with pytest.raises(ExecutorError):
        core.step()
    with pytest.raises(EngineDeadError):
        llm.generate("def g():", params, use_tqdm=False)
    t1 = time.monotonic()
    llm.shutdown()
    assert time.monotonic() - t1 < 10
    assert all(p.poll() is not None for p in core.executor.processes)
