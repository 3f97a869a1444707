"""Releasing the calling thread's idle OpenMP team (native/omp.py): the thread's helpers exit, the runtime says
so, and the engine's driving thread does it before a step. Checked by thread counts in a fresh process (what the
release is for, the worker's regions no longer throttled, is a speed: BENCHMARKS.md §17)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import os, time, torch
from tandem.native.omp import release_idle_team
def threads():
    return len(os.listdir('/proc/self/task'))
x = torch.randn(512, 512)
x @ x                      # a parallel op: this thread now keeps a team of helpers
before = threads()
ok = release_idle_team()
deadline = time.monotonic() + 5
while threads() > before - (torch.get_num_threads() - 1) and time.monotonic() < deadline:
    time.sleep(0.01)       # (a released helper leaves the task list as it exits)
print(ok, before - threads(), torch.get_num_threads() - 1)
x @ x                      # the next parallel op starts a new team
print(threads() - before)
"""


def test_the_callers_idle_team_is_released_and_comes_back_when_needed() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout.split()
    ok, released, helpers, regrown = out
    assert ok == "True"
    assert released == helpers  # every helper of this thread's team left
    assert regrown == "0"  # and the team is there again once needed


def test_the_llm_releases_its_callers_team_before_stepping() -> None:
    code = """
import os, torch
from tandem import LLM, SamplingParams
llm = LLM()
x = torch.randn(512, 512)
x @ x
with_team = len(os.listdir('/proc/self/task'))
llm.generate(["hi"], SamplingParams(max_tokens=2), use_tqdm=False)
print(with_team - len(os.listdir('/proc/self/task')), torch.get_num_threads() - 1)
llm.shutdown()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == out[1]  # the caller's helpers gone, the engine's own threads untouched
