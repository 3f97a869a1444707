"""The speculation policy's state over a server's life: an in-process ``tandem serve`` (the same engine thread and
app as the command), driven by ``tandem bench serve`` runs from a subprocess, and after each run the policy's cost
lines, class acceptance estimates and chosen k (``spec_decode_stats()["policy"]``). Every decode step the cost fit
saw (batch class, rows, passes, seconds, requests) is written to ``--steps FILE``; ``--replay FILE`` feeds such a
file to the cost fit of the checked-out code and prints how far its fitted cost of a draft (a row and a pass)
moved over the steps: the measure of the fit's noise in BENCHMARKS.md §19.

    python benchmarks/spec_policy_state.py --spec '{"method":"eagle3","num_speculative_tokens":3}' \\
        --temperatures 0.7 1.0 --runs 6 --steps /tmp/steps.json
    python benchmarks/spec_policy_state.py --replay /tmp/steps.json --label now --series /tmp/fit.json
    python benchmarks/spec_policy_state.py --replay /tmp/steps.json --base HEAD~1 --series /tmp/fit.json
    python benchmarks/spec_policy_state.py --plot /tmp/fit.json /tmp/fit.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_spec_policy import bench_run  # noqa: E402


def step_cost_class(base: str | None) -> type:
    """``StepCost`` of this checkout, or (``base``) of that git revision's core/step_cost.py, loaded on its own."""
    if base is None:
        from tandem.core.step_cost import StepCost

        return StepCost
    import importlib.util
    import subprocess

    src = subprocess.run(["git", "show", f"{base}:src/tandem/core/step_cost.py"], check=True, capture_output=True,
                         text=True, cwd=Path(__file__).parent).stdout
    path = Path(tempfile.mkdtemp(prefix="tandem-step-cost-")) / "step_cost_base.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("step_cost_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["step_cost_base"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.StepCost


def replay(path: Path, label: str | None = None, series: Path | None = None, base: str | None = None) -> None:
    """The cost fit of this checkout (or of revision ``base``) over recorded steps: per batch class, the fitted
    cost of one draft, a row's and a pass's (with ``series``: each class's cost of a draft step by step added to
    that JSON file under ``label``, for ``plot``)."""
    cost_class = step_cost_class(base)
    out = json.loads(series.read_text()) if series and series.exists() else {}

    by_class: dict[int, list[tuple[int, int, float]]] = {}
    for cls, rows, passes, seconds, *_requests in json.loads(path.read_text()):  # before session 31: no requests
        by_class.setdefault(cls, []).append((rows, passes, seconds))
    for cls, steps in sorted(by_class.items()):
        cost, fits = cost_class(), []
        for rows, passes, seconds in steps:
            cost.observe(rows, seconds, passes)
            if cost.fitted:
                fits.append((cost.per_row * 1e3, cost.per_pass * 1e3))
        if not fits:
            print(f"class {cls}: {len(steps)} steps, never fitted")
            continue
        est = [row + pass_ for row, pass_ in fits]
        out.setdefault(f"class {cls}", {})[label or base or "this checkout"] = est
        q, n = sorted(est), len(est)
        row, pass_ = sorted(f[0] for f in fits), sorted(f[1] for f in fits)
        print(f"class {cls}: {len(steps)} steps; a draft's fitted cost (row + pass) ms: "
              f"median {statistics.median(q):.2f} p5 {q[n // 20]:.2f} p95 {q[19 * n // 20]:.2f} "
              f"min {q[0]:.2f} max {q[-1]:.2f}; row median {statistics.median(row):.2f} ({row[0]:.2f}-{row[-1]:.2f}), "
              f"pass median {statistics.median(pass_):.2f} (max {pass_[-1]:.2f}); "
              f"last: row {cost.per_row * 1e3:.2f} pass {cost.per_pass * 1e3:.2f} settled {cost.settled}")
    if series:
        series.write_text(json.dumps(out))


def plot(series: Path, png: Path) -> None:
    """Each replayed checkout's fitted cost of a draft, step by step, a panel per batch class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(series.read_text())
    fig, axes = plt.subplots(len(data), 1, figsize=(9, 3 * len(data)), squeeze=False)
    for ax, (cls, runs) in zip(axes[:, 0], sorted(data.items())):
        for label, est in runs.items():
            ax.plot(est, label=label, lw=0.8)
        ax.set_title(f"{cls}: a draft's fitted cost (row + pass)")
        ax.set_xlabel("decode step (after the fit)")
        ax.set_ylabel("ms")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--spec", default='{"method":"eagle3","num_speculative_tokens":3}',
                    help="speculative_config as JSON")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7])
    ap.add_argument("--runs", type=int, default=4, help="bench serve runs per temperature and concurrency")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1],
                    help="streams; several: each temperature's runs at each in turn (bench_spec_pairs.py's order)")
    ap.add_argument("--num-prompts", type=int, default=0, help="prompts a run (0: one a stream, at least 8)")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--steps", help="write every decode step the cost fit saw here (JSON)")
    ap.add_argument("--replay", help="only replay a --steps file through this checkout's cost fit")
    ap.add_argument("--label", help="with --replay: this checkout's name in --series")
    ap.add_argument("--base", help="with --replay: the cost fit of this git revision instead of the checkout's")
    ap.add_argument("--series", help="with --replay: add the fitted cost step by step to this JSON file")
    ap.add_argument("--plot", nargs=2, metavar=("SERIES", "PNG"), help="only plot a --series file")
    ns = ap.parse_args()
    if ns.plot:
        plot(Path(ns.plot[0]), Path(ns.plot[1]))
        return 0
    if ns.replay:
        replay(Path(ns.replay), ns.label, Path(ns.series) if ns.series else None, ns.base)
        return 0

    import uvicorn

    from tandem.core import step_cost
    from tandem.core.spec_policy import AdaptivePolicy
    from tandem.engine.async_llm import AsyncLLM
    from tandem.entrypoints.openai.server import build_app

    steps: list[tuple[int, int, int, float, int]] = []  # (id of the StepCost, rows, passes, seconds, requests)
    observe = step_cost.StepCost.observe
    observe_step = AdaptivePolicy.observe_step
    reqs = [0]  # the step's decoding requests, as the policy read them (recorded, to tell steps apart by)

    def policy_step(self: AdaptivePolicy, so, busy: bool) -> None:  # type: ignore[no-untyped-def]
        reqs[0] = len(so.num_scheduled_tokens)
        observe_step(self, so, busy)

    def recording(self: step_cost.StepCost, rows: int, seconds: float, passes: int = 0) -> None:
        steps.append((id(self), rows, passes, seconds, reqs[0]))
        observe(self, rows, seconds, passes)

    step_cost.StepCost.observe = recording  # type: ignore[method-assign]
    AdaptivePolicy.observe_step = policy_step  # type: ignore[method-assign]
    engine = AsyncLLM(ns.model, max_num_seqs=64, speculative_config=json.loads(ns.spec))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(build_app(engine, None, None, None, None), log_level="warning",
                                           access_log=False))
    threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True).start()
    while not server.started:
        time.sleep(0.1)
    policy = engine.engine.core.scheduler.spec_policy
    logs = Path(tempfile.mkdtemp(prefix="tandem-policy-state-"))  # each run's bench serve result
    try:
        for temp, conc in ((t, c) for t in ns.temperatures for c in ns.concurrency):
            run_ns = argparse.Namespace(num_prompts=ns.num_prompts or max(8, conc), output_len=ns.output_len)
            for i in range(ns.runs):
                _, run = bench_run(url, temp, conc, run_ns, logs)
                r = run["result"]
                sd = r.get("spec_decode", {})
                print(f"T {temp} c {conc} run {i + 1}/{ns.runs} ({run['placement']}): "
                      f"{r['output_throughput']:.1f} tok/s, "
                      f"drafts {sd.get('num_draft_tokens', 0):.0f}, accepted {sd.get('num_accepted_tokens', 0):.0f}",
                      flush=True)
                state = policy.as_dict()
                print("  cost:", json.dumps(state.get("cost")))
                print("  acceptance:", json.dumps(state.get("acceptance_by_temperature")),
                      "verified k:", state.get("verified_k"), flush=True)
    finally:
        server.should_exit = True
        time.sleep(0.5)
        engine.shutdown()
    if ns.steps:  # each step under its batch class (1: one request, 2: 2-3, 3: 4-7, ...)
        classes = {id(line.cost): c for c, line in policy.lines.items()}
        Path(ns.steps).write_text(json.dumps([(classes[i], *rest) for i, *rest in steps]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
