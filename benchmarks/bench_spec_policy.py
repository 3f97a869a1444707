"""The speculation policy under load: no speculation vs each method with the ``fixed`` and the ``adaptive``
policy, served by ``tandem serve`` and driven by ``tandem bench serve`` at several concurrencies and
temperatures. One server per arm, all started first (an idle server uses no CPU); at every point (temperature,
concurrency) the arms run one after another in an order that rotates from point to point, so a slow spell of
the machine falls on every arm alike. With ``--repeats N`` the whole grid runs N times, each time on fresh
servers: on these VMs one process can run a few per cent faster or slower than another for its whole life, and
the time between a point's repeats spreads them over the machine's slow and fast spells. Each run is labelled
with the vCPUs' placement over it (``near`` / ``far`` / ``mixed``: common.placement_of, measured before and after
it), and a table compares the arms within each placement (BENCHMARKS.md §13: a VM's placement changes mid-run
and moves speculation's speed far more than plain decoding's).

    python benchmarks/bench_spec_policy.py                                   # defaults below
    python benchmarks/bench_spec_policy.py --concurrency 1 4 16 32 --temperatures 0 0.7 1.0 \\
        --methods ngram eagle3 --num-prompts 32 --output-len 64
    python benchmarks/bench_spec_policy.py --methods ngram eagle3 suffix --fixed-k 0 --repeats 3  # adaptive only
    python benchmarks/bench_spec_policy.py --aa ...   # with an A/A control: a second no-speculation server
    python benchmarks/bench_spec_policy.py --base HEAD~1 ...  # each adaptive arm also from a worktree of HEAD~1
    python benchmarks/bench_spec_policy.py --same-placement 3 ...  # a point's round again where the placement moved

Writes ``benchmarks/results/spec_policy.json`` (every run's ``bench serve`` result; ``--name`` changes the
stem), a Markdown table (output tok/s and the ratio to no speculation at each point; with several
``--fixed-k``, the adaptive policy against the best fixed k at each point) and a plot ``spec_policy.png``. With
``--same-placement N`` a point whose round of arms did not all run in one placement is run again (up to N times);
a table then compares the arms within the rounds that did, and the plot and the best-fixed table use those rounds.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_serve import start_server, stop_server  # noqa: E402
from common import core_round_trip_ns, environment, placement_of  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def arms(methods: list[str], k: int, fixed_k: list[int], aa: bool = False) -> dict[str, list[str]]:
    """nospec; with ``aa`` a second no-speculation server, ``nospec_b`` (an A/A control: its ratio to nospec is
    the measurement's own spread); per method the fixed policy at each of ``fixed_k`` (``m_fixed`` at k itself,
    ``m_fixed_k<j>`` otherwise; none for 0) and the adaptive one (up to k)."""
    out: dict[str, list[str]] = {"nospec": []} | ({"nospec_b": []} if aa else {})
    for m in methods:
        for j in sorted(set(fixed_k) - {0}):
            cfg = {"method": m, "num_speculative_tokens": j, "policy": "fixed"}
            name = f"{m}_fixed" if j == k else f"{m}_fixed_k{j}"
            out[name] = ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
        cfg = {"method": m, "num_speculative_tokens": k, "policy": "adaptive"}
        out[f"{m}_adaptive"] = ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
    return out


def base_arms(table: dict[str, list[str]], methods: list[str], rev: str) -> dict[str, Path]:
    """Adds ``<method>_adaptive_base`` to ``table`` for every method: the adaptive arm again, run from a git
    worktree of ``rev`` (removed at exit, also when a run fails or is interrupted). Returns each such arm's
    source folder, for ``start_server``."""
    tree = Path(tempfile.mkdtemp(prefix="tandem-policy-base-")) / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True, capture_output=True)
    atexit.register(subprocess.run, ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False,
                    capture_output=True)
    for m in methods:
        table[f"{m}_adaptive_base"] = table[f"{m}_adaptive"]
    return {f"{m}_adaptive_base": tree / "src" for m in methods}


def start_servers(servers: dict[str, tuple[Any, str]], table: dict[str, list[str]], flags: str, logs: Path,
                  sources: dict[str, Path], label: str = "", log_suffix: str = "") -> list[str]:
    """Starts every arm's ``tandem serve`` (``flags`` and the arm's own; its log ``logs/ARM{log_suffix}.log``),
    filling ``servers`` (arm: process, URL) as each comes up — so a caller's ``finally`` stops those started
    when a later one fails. Returns their command lines."""
    commands = []
    for i, (arm, extra) in enumerate(table.items()):
        print(f"[{label}{i + 1}/{len(table)}] starting the {arm} server", flush=True)
        proc, url, cmd = start_server([*shlex.split(flags), *extra], logs / f"{arm}{log_suffix}.log",
                                      sources.get(arm))
        servers[arm] = (proc, url)
        commands.append(shlex.join(cmd))
    return commands


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    ap.add_argument("--methods", nargs="+", default=["ngram", "eagle3"])
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens (the adaptive policy's maximum)")
    ap.add_argument("--fixed-k", type=int, nargs="+",
                    help="k of the fixed-policy arms (default: --k alone; 0: no fixed arm)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of the whole grid, each on fresh servers; tok/s = all their tokens / all their time")
    ap.add_argument("--same-placement", type=int, default=0, metavar="N",
                    help="run a point's round of arms again, up to N times, until every arm of the round ran in "
                    "one placement of the vCPUs (a table then compares the arms within those rounds alone)")
    ap.add_argument("--aa", action="store_true",
                    help="add nospec_b, a second no-speculation server: the A/A control of the comparison")
    ap.add_argument("--base", help="git revision: every adaptive arm also runs from a worktree of it "
                    "(``<method>_adaptive_base``), side by side with this checkout's")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--server-flags", default="--max-num-seqs 64", help="extra `tandem serve` flags")
    ap.add_argument("--out-dir", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--name", default="spec_policy", help="output files NAME.json / .md / .png")
    ns = ap.parse_args()
    out_dir = Path(ns.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="tandem-bench-policy-"))
    print(f"server logs and each run's bench serve result: {logs}", flush=True)
    table = arms(ns.methods, ns.k, ns.fixed_k or [ns.k], ns.aa)
    sources = base_arms(table, ns.methods, ns.base) if ns.base else {}
    commands: list[str] = []
    runs, names = [], list(table)
    points = [(t, c) for t in ns.temperatures for c in ns.concurrency]
    total = f"{len(points) * len(names) * ns.repeats}{'+' if ns.same_placement else ''}"  # (+: rounds run again)
    for rep in range(ns.repeats):  # every repeat on fresh servers: one process's speed is not every repeat's
        servers = {}
        try:
            started = start_servers(servers, table, ns.server_flags, logs, sources,
                                    f"repeat {rep + 1}/{ns.repeats}, ", f"-{rep}")
            if rep == 0:
                commands += started
            for p, (temp, conc) in enumerate(points):
                i = rep * len(points) + p
                order = names[i % len(names):] + names[: i % len(names)]
                for attempt in range(1 + ns.same_placement):  # again while the placement moved within the round
                    first = len(runs)
                    for arm in order:
                        bench, run = bench_run(servers[arm][1], temp, conc, ns, logs)
                        if i == 0 and attempt == 0 and arm == order[0]:
                            commands.append(shlex.join(bench).replace(servers[arm][1], "http://127.0.0.1:PORT"))
                        runs.append({"arm": arm, "temperature": temp, "concurrency": conc, "repeat": rep, **run})
                        print(f"[{len(runs)}/{total}] T={temp} c={conc} {arm}: "
                              f"{run['result']['output_throughput']:.1f} tok/s ({run['placement']})", flush=True)
                    moved = {r["placement"] for r in runs[first:]}
                    for r in runs[first:]:
                        r["round"], r["uniform"] = attempt, len(moved) == 1 and "mixed" not in moved
                    if runs[first]["uniform"]:
                        break
                    if attempt < ns.same_placement:
                        print(f"T={temp} c={conc}: the placement moved within the round "
                              f"({', '.join(sorted(moved))}), running the point again", flush=True)
        finally:
            for proc, _ in servers.values():
                stop_server(proc)
    # The machine (CPU kind, cpu_isa, load average at the end of the run) beside the numbers.
    meta = {"environment": environment(), "commands": commands, "base": ns.base, "num_prompts": ns.num_prompts,
            "output_len": ns.output_len, "repeats": ns.repeats}
    (out_dir / f"{ns.name}.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    summary = report(runs, list(table), ns)
    (out_dir / f"{ns.name}.md").write_text(summary + "\n")
    print(summary)
    plot(runs, list(table), ns, out_dir / f"{ns.name}.png")
    return 0


def bench_run(url: str, temp: float, conc: int, ns: argparse.Namespace, logs: Path) -> tuple[list[str], dict]:
    """One ``tandem bench serve`` run against the server at ``url``: its command line, and its result with the
    vCPUs' placement over it."""
    result = Path(tempfile.mkstemp(suffix=".json", dir=logs)[1])
    bench = ["tandem", "bench", "serve", "--base-url", url, "--dataset-name", "humaneval", "--num-prompts",
             str(ns.num_prompts), "--random-output-len", str(ns.output_len), "--max-concurrency", str(conc),
             "--temperature", str(temp), "--seed", "0", "--result-file", str(result), "--disable-tqdm"]
    before = core_round_trip_ns()
    subprocess.run([sys.executable, "-m", "tandem.entrypoints.cli", *bench[1:]], check=True, stdout=subprocess.DEVNULL)
    where = placement_of(before, core_round_trip_ns())
    return bench, {"placement": where, "result": json.loads(result.read_text())}


def _results(runs: list[dict], arm: str, temp: float, conc: int, where: str | None = None) -> list[dict]:
    """An arm's ``bench serve`` results at a point (``where``: only the runs that stayed in that placement;
    ``"uniform"``: only the rounds in which every arm ran in one placement, ``--same-placement``)."""
    return [r["result"] for r in runs if r["arm"] == arm and r["temperature"] == temp and r["concurrency"] == conc
            and (where in (None, r.get("placement")) or (where == "uniform" and r.get("uniform")))]


def _tput(runs: list[dict], arm: str, temp: float, conc: int, where: str | None = None) -> float | None:
    """Output tok/s of an arm at a point: every repeat's tokens over every repeat's time (``where``: only the runs
    that stayed in that placement of the vCPUs; None where there is none)."""
    mine = _results(runs, arm, temp, conc, where)
    return sum(d["total_output_tokens"] for d in mine) / sum(d["duration"] for d in mine) if mine else None


def _where(runs: list[dict], temp: float, conc: int, ns: argparse.Namespace) -> str | None:
    """``"uniform"`` where ``--same-placement`` got a point a round in one placement (its arms compared there),
    else None (every run)."""
    return "uniform" if ns.same_placement and any(
        r.get("uniform") for r in runs if (r["temperature"], r["concurrency"]) == (temp, conc)) else None


T95 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23]  # Student's t, 95 % two-sided, 1-10 dof


def ratio_spread(runs: list[dict], arm: str, temp: float, conc: int) -> tuple[float, float, float, float]:
    """An arm's tok/s over no speculation's, repeat by repeat (each repeat's arms ran side by side): their mean,
    the 95 % confidence half-width of that mean (Student's t), the lowest and the highest."""
    def tput(a: str, rep: int) -> float:  # over the repeat's rounds at the point (``--same-placement``)
        mine = [r["result"] for r in runs if (r["arm"], r["temperature"], r["concurrency"], r["repeat"])
                == (a, temp, conc, rep)]
        return sum(d["total_output_tokens"] for d in mine) / sum(d["duration"] for d in mine)

    reps = sorted({r["repeat"] for r in runs})
    ratios = [tput(arm, rep) / tput("nospec", rep) for rep in reps]
    n = len(ratios)
    mean = sum(ratios) / n
    sd = (sum((x - mean) ** 2 for x in ratios) / (n - 1)) ** 0.5 if n > 1 else 0.0
    half = (T95[n - 2] if n - 1 <= len(T95) else 1.96) * sd / n ** 0.5 if n > 1 else 0.0
    return mean, half, min(ratios), max(ratios)


def report(runs: list[dict], names: list[str], ns: argparse.Namespace) -> str:
    lines = ["| temperature | concurrency | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for temp in ns.temperatures:
        for conc in ns.concurrency:
            base = _tput(runs, "nospec", temp, conc)
            cells = []
            for arm in names:
                v = _tput(runs, arm, temp, conc)
                cells.append(f"{v:.1f}" if arm == "nospec" else f"{v:.1f} ({v / base:.2f}x)")
            lines.append(f"| {temp} | {conc} | " + " | ".join(cells) + " |")
    if ns.repeats > 1:  # the ratio repeat by repeat: mean +- 95 % confidence half-width [lowest, highest]
        lines += ["", "| temperature | concurrency | " + " | ".join(f"{a} / nospec, per repeat" for a in names[1:])
                  + " |", "|---|---|" + "---|" * (len(names) - 1)]
        for temp in ns.temperatures:
            for conc in ns.concurrency:
                cells = []
                for arm in names[1:]:
                    mean, half, lo, hi = ratio_spread(runs, arm, temp, conc)
                    cells.append(f"{mean:.3f} ± {half:.3f} [{lo:.2f}, {hi:.2f}]")
                lines.append(f"| {temp} | {conc} | " + " | ".join(cells) + " |")
    if any(r.get("placement") in ("near", "far") for r in runs):  # each arm's runs that stayed in one placement
        lines += ["", "| temperature | concurrency | placement | " + " | ".join(f"{a} / nospec" for a in names[1:])
                  + " |", "|---|---|---|" + "---|" * (len(names) - 1)]
        for temp in ns.temperatures:
            for conc in ns.concurrency:
                for where in ("near", "far"):
                    base = _tput(runs, "nospec", temp, conc, where)
                    cells = []
                    for arm in names[1:]:
                        v = _tput(runs, arm, temp, conc, where)
                        n = len(_results(runs, arm, temp, conc, where))
                        cells.append(f"{v / base:.2f} ({n})" if v and base else "—")
                    lines.append(f"| {temp} | {conc} | {where} | " + " | ".join(cells) + " |")
    if ns.same_placement:  # only the rounds in which every arm ran in one placement
        lines += ["", "| temperature | concurrency | rounds in one placement | " + " | ".join(
            f"{a} / nospec" for a in names[1:]) + " |", "|---|---|---|" + "---|" * (len(names) - 1)]
        for temp in ns.temperatures:
            for conc in ns.concurrency:
                mine = [r for r in runs if (r["temperature"], r["concurrency"], r["arm"]) == (temp, conc, "nospec")
                        and r.get("uniform")]
                base = _tput(runs, "nospec", temp, conc, "uniform")
                cells = [f"{_tput(runs, a, temp, conc, 'uniform') / base:.2f}" if base else "—" for a in names[1:]]
                what = ", ".join(r["placement"] for r in mine) or "none"
                lines.append(f"| {temp} | {conc} | {what} | " + " | ".join(cells) + " |")
    fixed = {m: [a for a in names if a.startswith(f"{m}_fixed")] for m in ns.methods}
    if any(len(v) > 1 for v in fixed.values()):  # the adaptive policy against the best fixed k, point by point
        # (with --same-placement: within the rounds in one placement where a point has one)
        lines += ["", "| temperature | concurrency | " + " | ".join(f"{m} adaptive / best fixed" for m in ns.methods)
                  + " |", "|---|---|" + "---|" * len(ns.methods)]
        for temp in ns.temperatures:
            for conc in ns.concurrency:
                cells, w = [], _where(runs, temp, conc, ns)
                for m in ns.methods:
                    best = max(fixed[m], key=lambda a: _tput(runs, a, temp, conc, w))
                    cells.append(f"{_tput(runs, f'{m}_adaptive', temp, conc, w) / _tput(runs, best, temp, conc, w):.2f}"
                                 f" ({best})")
                lines.append(f"| {temp} | {conc} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def temperature_axes(temperatures: list[float]) -> tuple[Any, list[Any]]:
    """A headless figure with one panel a temperature (concurrency on a log axis in each, ``finish_axes``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(temperatures), figsize=(5 * len(temperatures), 4), sharey=True)
    return fig, list(axes) if len(temperatures) > 1 else [axes]


def finish_axes(fig: Any, axes: list[Any], temperatures: list[float], ylabel: str, path: Path) -> None:
    """The panels' reference line at 1.0, axes, titles and legend; the figure saved at ``path``."""
    for ax, temp in zip(axes, temperatures):
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(f"temperature {temp}")
    axes[0].set_ylabel(ylabel)
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot(runs: list[dict], names: list[str], ns: argparse.Namespace, path: Path) -> None:
    fig, axes = temperature_axes(ns.temperatures)
    for ax, temp in zip(axes, ns.temperatures):
        wheres = [_where(runs, temp, c, ns) for c in ns.concurrency]  # each point's runs compared
        for arm in names[1:]:
            ratios = [_tput(runs, arm, temp, c, w) / _tput(runs, "nospec", temp, c, w)
                      for c, w in zip(ns.concurrency, wheres)]
            ax.plot(ns.concurrency, ratios, marker="o", linestyle="-" if "adaptive" in arm else "--", label=arm)
    finish_axes(fig, axes, ns.temperatures, "output tok/s / no speculation", path)


if __name__ == "__main__":
    sys.exit(main())
