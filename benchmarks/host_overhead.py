"""Host time per decode step, two source trees side by side, interleaved (issue 21's host-overhead check).

Host time = the tracer's ``schedule`` + ``update`` (engine thread) + ``prepare_inputs`` + ``sampling_metadata``
(worker) spans per step, at N-way greedy decode of the default model (HumanEval prompts, 64 tokens a stream,
256 for a single stream; ``uni`` executor, after a warm-up run). The spans are taken with synchronous
scheduling: with async scheduling the engine thread's Python runs while the worker prepares the next step, and
a worker span then also holds the time it waits for the GIL (at 32-way most of ``prepare_inputs``), which
says nothing about the work itself. End-to-end tok/s is measured with async scheduling (the default), in
another process of the same round. Each round runs every tree once, in turn, each in fresh processes, so
drift of the machine hits both alike.

    python benchmarks/host_overhead.py --tree before=/path/to/old/checkout --tree after=. --n 32 1 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HOST_SPANS = ("schedule", "update", "prepare_inputs", "sampling_metadata")


def max_tokens(n: int) -> int:
    """64 tokens a stream; single streams decode 256 (64 steps of ~6 ms are too short a window to time)."""
    return 64 if n > 4 else 256


def child(n: int, async_scheduling: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tempfile

    from common import humaneval

    from tandem import LLM, SamplingParams

    llm = LLM(max_num_seqs=n, async_scheduling=async_scheduling, trace_file=str(Path(tempfile.gettempdir()) / "host.json"))
    prompts = humaneval(32)
    params = SamplingParams(temperature=0, max_tokens=max_tokens(n), ignore_eos=True)
    llm.generate(prompts[:n], params, use_tqdm=False)  # warm-up
    llm.engine.tracer.clear()
    t0 = time.perf_counter()
    llm.generate(prompts[:n], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    spans: dict[str, float] = defaultdict(float)
    for span in llm.engine.tracer.spans:
        spans[span.name] += span.dur_ns / 1e6
    steps = sum(1 for s in llm.engine.tracer.spans if s.name == "forward")
    llm.shutdown()
    print(json.dumps({"tok_s": n * max_tokens(n) / elapsed, "steps": steps,
                      "ms_per_step": {k: v / steps for k, v in spans.items()}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout (its src/ is used)")
    ap.add_argument("--n", type=int, nargs="+", default=[32, 1])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="benchmarks/results/host_overhead.json")
    ap.add_argument("--plot", default="benchmarks/results/host_overhead.png")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-async", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, bool(args.child_async))
        return
    trees = dict(t.split("=", 1) for t in args.tree)
    runs: dict[str, dict[int, list[dict]]] = {name: defaultdict(list) for name in trees}
    total, done = args.rounds * len(args.n) * len(trees), 0
    for r in range(args.rounds):
        for n in args.n:
            for name, path in trees.items():
                env = {**os.environ, "PYTHONPATH": str(Path(path).resolve() / "src")}
                res = {}
                for mode in (0, 1):  # host spans from the sync run, tok/s from the async run
                    out = subprocess.run([sys.executable, __file__, "--tree", "x=.", "--child", str(n),
                                          "--child-async", str(mode)], env=env, capture_output=True, text=True,
                                         check=True)
                    res["sync" if mode == 0 else "async"] = json.loads(out.stdout.strip().splitlines()[-1])
                res = {"ms_per_step": res["sync"]["ms_per_step"], "tok_s": res["async"]["tok_s"],
                       "async_ms_per_step": res["async"]["ms_per_step"], "sync_tok_s": res["sync"]["tok_s"]}
                runs[name][n].append(res)
                done += 1
                host = sum(res["ms_per_step"].get(s, 0.0) for s in HOST_SPANS)
                print(f"[{done}/{total}] round {r + 1} n={n} {name}: host {host:.3f} ms/step (sync), "
                      f"{res['tok_s']:.1f} tok/s (async)", flush=True)
    summary: dict[str, dict] = {}
    for name in trees:
        summary[name] = {}
        for n in args.n:
            rs = runs[name][n]
            per = {s: statistics.median(r["ms_per_step"].get(s, 0.0) for r in rs) for s in HOST_SPANS}
            summary[name][str(n)] = {"host_ms": sum(per.values()), "spans_ms": per,
                                     "tok_s": statistics.median(r["tok_s"] for r in rs)}
    for n in args.n:
        print(f"n={n}: " + "  ".join(f"{name}: host {summary[name][str(n)]['host_ms']:.3f} ms, "
                                     f"{summary[name][str(n)]['tok_s']:.1f} tok/s" for name in trees))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import environment

    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"environment": environment(), "trees": trees, "summary": summary,
                                           "runs": {k: dict(v) for k, v in runs.items()}}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.n), figsize=(5 * len(args.n), 4))
    for ax, n in zip(axes if len(args.n) > 1 else [axes], args.n):
        bottom = [0.0] * len(trees)
        for s in HOST_SPANS:
            vals = [summary[name][str(n)]["spans_ms"][s] for name in trees]
            ax.bar(list(trees), vals, bottom=bottom, label=s)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_title(f"{n}-way decode: host ms per step")
        ax.set_ylabel("ms")
    axes_list = axes if len(args.n) > 1 else [axes]
    axes_list[0].legend()
    fig.tight_layout()
    fig.savefig(args.plot)
    print(f"wrote {args.json} and {args.plot}")


if __name__ == "__main__":
    main()
