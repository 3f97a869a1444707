"""A worker process that dies mid-generation fails the affected requests with a clear error within
seconds and leaves a cleanly shut-down engine — never a hang."""

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


@pytest.mark.parametrize("async_on", [False, True])
def test_killed_worker_fails_requests_fast(async_on):
    llm = LLM(max_num_seqs=4, executor_backend="mp", async_scheduling=async_on)
    core, tok = llm.engine.core, llm.tokenizer
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for i in range(4):
        core.add_request(Request(f"r{i}", tok.encode(f"def f{i}():"), params, seed=i))
    for _ in range(3):
        core.step()
    os.kill(core.executor.process.pid, signal.SIGKILL)
    t0 = time.monotonic()
    failed: dict[str, str] = {}
    while core.has_unfinished_requests() and time.monotonic() - t0 < 30:
        for out in core.step():
            if out.finish_reason == "error":
                failed[out.req_id] = out.error or ""
    assert time.monotonic() - t0 < 10
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
