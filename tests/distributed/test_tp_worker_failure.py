"""Tensor parallelism: killing either rank's worker process mid-generation fails every live request
with a clear error within seconds, marks the engine failed, and shutdown does not hang — even though
the surviving rank may be blocked in a collective with the dead one."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tandem import LLM
from tandem.engine.llm import EngineDeadError
from tandem.executor.base import ExecutorError
from tests.helpers import collect_failures, start_requests

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("rank,async_on", [(1, True), (0, False)])
def test_killed_rank_fails_requests_fast(rank: int, async_on: bool) -> None:
    llm = LLM(
        max_num_seqs=4, executor_backend="mp", tensor_parallel_size=2, async_scheduling=async_on
    )
    core = llm.engine.core
    params = start_requests(core, llm.tokenizer)
    os.kill(core.executor.processes[rank].pid, signal.SIGKILL)
    failed, elapsed = collect_failures(core, 30)
    assert elapsed < 10
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
