"""The repository's examples (examples/offline_inference/) run as a user runs them, and print what they
promise: the calls vLLM's own offline examples make (an ``LLM`` from ``EngineArgs`` command-line options,
default sampling parameters set field by field, chat with a per-call template, speculative decoding with vLLM's
keys and metric classes, structured outputs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "offline_inference"


def _run(name: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_basic() -> None:
    out = _run("basic.py")
    assert out.count(" -> ") == 3 and "'The capital of France is'" in out


def test_chat_from_engine_arguments() -> None:
    out = _run("chat.py", "--max-tokens", "8", "--batch", "2", "--max_model_len", "1024", "--enforce-eager",
               "--gpu-memory-utilization", "0.05", "--no-enable-lora", "--temperature", "0")
    assert "one: " in out and "batch: [8, 8]" in out and "own template prompt ends: " in out
    assert "assistant:" in out.split("own template prompt ends: ")[1]


def test_spec_decode_with_vllms_keys_and_metric_classes() -> None:
    out = _run("spec_decode.py", "--method", "eagle3", "--num-prompts", "2", "--output-len", "24")
    assert "output tokens: 48" in out
    length = float(out.split("mean acceptance length: ")[1].split()[0])
    assert 1.0 < length <= 4.0


def test_structured_outputs() -> None:
    out = _run("structured_outputs.py")
    lines = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert lines["choice"] in ("'Positive'", "'Negative'")
    assert "@" in lines["regex"] and lines["regex"].endswith(".com'")
    assert lines["grammar"].startswith("'SELECT col_")
