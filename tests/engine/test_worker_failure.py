"""A worker process that dies mid-generation fails the affected requests with a clear error within
seconds and leaves a cleanly shut-down engine — never a hang."""

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


@pytest.mark.parametrize("async_on", [False, True])
def test_killed_worker_fails_requests_fast(async_on):
    llm = LLM(max_num_seqs=4, executor_backend="mp", async_scheduling=async_on)
    core = llm.engine.core
    params = start_requests(core, llm.tokenizer)
    os.kill(core.executor.process.pid, signal.SIGKILL)
    failed, elapsed = collect_failures(core, 30)
    assert elapsed < 10
    assert set(failed) == {f"r{i}" for i in range(4)}
    assert all("worker process died" in e for e in failed.values()), failed
    assert not core.scheduler.requests and core.scheduler.kv.all_free()
    with pytest.raises(ExecutorError):
        core.step()
    with pytest.raises(EngineDeadError):
        llm.generate("def g():", params, use_tqdm=False)
    t1 = time.monotonic()
    llm.shutdown()
    assert time.monotonic() - t1 < 10
