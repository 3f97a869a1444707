"""The speculation policy against no speculation in *pairs* of short serving runs, compared only where both runs of
a pair kept one placement of the vCPUs (issue 22's "never slower" check, on a VM whose speed moves by more than
the 3 % the check is about).

On these 2-vCPU VMs the two vCPUs move between one core complex (*near*) and two (*far*) every ~20-40 s, and a
speculating server's speed moves with them far more than plain decoding's (BENCHMARKS.md §13, §19): a round of
five servers' runs at one point (``bench_spec_policy.py``) takes longer than a placement lasts at one and four
streams, so its arms were never compared in one placement there. Here every comparison is a pair — the
no-speculation server's run and one arm's, back to back, short (``--min-prompts`` prompts or one per stream,
``--output-len`` tokens each; a few seconds) and in alternating order — and a pair counts only where the
placement measured before, between and after its two runs agrees (``common.placement_of``). Each arm's ratio at
a point is the geometric mean of its counted pairs' ratios (output tok/s over no speculation's), with a 95 %
confidence interval from their spread (Student's t on the logarithms), over all counted pairs and per placement.
Before a point's pairs every server serves its prompts once, not counted, so that each finds them in its prefix
cache alike. Pairs are run until each arm has ``--pairs`` counted ones at the point, at most ``--max-pairs``
tried; arms take turns pair by pair. ``--aa`` adds a second no-speculation server, the A/A control: its ratio is
the method's own spread.

    python benchmarks/bench_spec_pairs.py --aa --methods ngram suffix eagle3 --concurrency 1 4 \\
        --temperatures 0 0.7 1.0 --pairs 4 --name spec_pairs_c1_c4
    python benchmarks/bench_spec_pairs.py --methods eagle3 --fixed-k 1 3 ...   # fixed-k arms as well
    python benchmarks/bench_spec_pairs.py --base HEAD~1 ...   # each adaptive arm also from a worktree of HEAD~1
    python benchmarks/bench_spec_pairs.py --restarts 3 --pairs 2 ...   # three sets of fresh servers, pooled
    python benchmarks/bench_spec_pairs.py --report A.json B.json --name grid   # several runs' pairs pooled

Writes ``benchmarks/results/NAME.json`` (every run's ``bench serve`` result and its pair), ``NAME.md`` (the
table) and ``NAME.png`` (each arm's ratio with its interval, per temperature).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_serve import stop_server  # noqa: E402
from bench_spec_policy import T95, arms, base_arms, bench_run, finish_axes, start_servers, temperature_axes  # noqa: E402
from common import environment  # noqa: E402


def prompts_at(conc: int, ns: argparse.Namespace) -> int:
    """Prompts of one run at ``conc`` streams: one a stream, at least ``--min-prompts``."""
    return max(ns.min_prompts, conc)


def pair_uniform(first: dict, second: dict) -> str | None:
    """The placement both runs of a pair kept (``near`` / ``far``), None where it moved (or is unknown)."""
    where = {first["placement"], second["placement"]}
    return where.pop() if len(where) == 1 and not where & {"mixed", "unknown"} else None


def summarize(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of ``ratios`` and its 95 % confidence interval (Student's t on the logarithms)."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    if n < 2:
        return math.exp(mean), float("nan"), float("nan")
    sd = (sum((x - mean) ** 2 for x in logs) / (n - 1)) ** 0.5
    half = (T95[n - 2] if n - 1 <= len(T95) else 1.96) * sd / n ** 0.5
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def counted(pairs: list[dict], arm: str, temp: float, conc: int, where: str | None = None) -> list[float]:
    """The ratios of an arm's counted pairs at a point (``where``: only those in that placement)."""
    return [p["ratio"] for p in pairs if (p["arm"], p["temperature"], p["concurrency"]) == (arm, temp, conc)
            and p["placement"] is not None and where in (None, p["placement"])]


def cell(ratios: list[float]) -> str:
    """Geometric mean [95 % interval], median, (pairs): single runs here have a low tail (a run 10-20 % slow
    among alike ones), which moves a mean more than the median."""
    if not ratios:
        return "—"
    g, lo, hi = summarize(ratios)
    med = statistics.median(ratios)
    return f"{g:.3f} [{lo:.3f}, {hi:.3f}] med {med:.3f} ({len(ratios)})" if len(ratios) > 1 else f"{g:.3f} (1)"


def report(pairs: list[dict], names: list[str], ns: argparse.Namespace) -> str:
    lines = ["Each cell: geometric mean of the counted pairs' ratios (arm / no speculation) [95 % interval], their "
             "median, (counted pairs)", "", "| T | c | placement | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for temp in ns.temperatures:
        for conc in ns.concurrency:
            for where in (None, "near", "far"):
                cells = [cell(counted(pairs, a, temp, conc, where)) for a in names]
                lines.append(f"| {temp} | {conc} | {where or 'all counted'} | " + " | ".join(cells) + " |")
    tried = len(pairs)
    kept = sum(p["placement"] is not None for p in pairs)
    lines += ["", f"Pairs tried {tried}, counted {kept} (the rest: the placement moved within the pair)."]
    return "\n".join(lines)


def plot(pairs: list[dict], names: list[str], ns: argparse.Namespace, path: Path) -> None:
    fig, axes = temperature_axes(ns.temperatures)
    for ax, temp in zip(axes, ns.temperatures):
        for i, arm in enumerate(names):
            xs, ys, err = [], [], [[], []]
            for conc in ns.concurrency:
                r = counted(pairs, arm, temp, conc)
                if not r:
                    continue
                g, lo, hi = summarize(r)
                lo, hi = (g, g) if math.isnan(lo) else (lo, hi)
                xs.append(conc * (1 + 0.06 * (i - len(names) / 2)))  # arms side by side at each point
                ys.append(g)
                err[0].append(g - lo)
                err[1].append(hi - g)
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=arm)
        ax.axhline(0.97, color="red", linewidth=0.8, linestyle=":")
    finish_axes(fig, axes, ns.temperatures, "output tok/s / no speculation (pairs in one placement)", path)


def run_points(servers: dict, table: dict, names: list[str], temp: float, conc: int, rnd: int,
               ns: argparse.Namespace, logs: Path, pairs: list[dict], commands: list[str], max_pairs: int) -> None:
    """One point's pairs on one set of servers: a warm-up run on every server, then pairs until each arm has
    ``--pairs`` counted ones (``--max-pairs`` tried at most), appended to ``pairs``."""
    run_ns = argparse.Namespace(num_prompts=prompts_at(conc, ns), output_len=ns.output_len)
    # One run a server first, not counted: a point's prompts then sit in every server's prefix cache
    # alike (without it an arm's first run prefilled them while no speculation's, after the A/A pair,
    # found them cached: 0.54-0.77x at each new point of the first grid, whatever the arm drafted).
    print(f"[T={temp} c={conc}] a warm-up run on every server", flush=True)
    for a in table:
        bench_run(servers[a][1], temp, conc, run_ns, logs)
    todo = {a: ns.pairs for a in names}
    for attempt in range(max_pairs):
        for arm in [a for a in names if todo[a] > 0]:
            order = ("nospec", arm) if (attempt + len(pairs)) % 2 == 0 else (arm, "nospec")
            runs = {}
            for a in order:
                bench, run = bench_run(servers[a][1], temp, conc, run_ns, logs)
                if len(commands) == len(table):  # the servers' lines, then the first run's
                    commands.append(shlex.join(bench).replace(servers[a][1], "http://127.0.0.1:PORT"))
                runs[a] = run
            where = pair_uniform(runs[order[0]], runs[order[1]])
            ratio = runs[arm]["result"]["output_throughput"] / runs["nospec"]["result"]["output_throughput"]
            pairs.append({"arm": arm, "temperature": temp, "concurrency": conc, "order": list(order),
                          "placement": where, "ratio": ratio, "round": rnd, "runs": runs})
            todo[arm] -= where is not None
            print(f"[T={temp} c={conc} try {attempt + 1}] {arm} / nospec {ratio:.3f} "
                  f"({where or 'moved'}; {todo[arm]} to go)", flush=True)
        if not any(v > 0 for v in todo.values()):
            break


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    ap.add_argument("--methods", nargs="+", default=["ngram", "suffix", "eagle3"])
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens (the adaptive policy's maximum)")
    ap.add_argument("--fixed-k", type=int, nargs="+", default=[0], help="k of fixed-policy arms (0: none)")
    ap.add_argument("--aa", action="store_true", help="add nospec_b, a second no-speculation server")
    ap.add_argument("--base", help="git revision: every adaptive arm also runs from a worktree of it "
                    "(``<method>_adaptive_base``)")
    ap.add_argument("--pairs", type=int, default=4, help="counted pairs wanted per arm and point (per round)")
    ap.add_argument("--restarts", type=int, default=1, help="rounds, each on freshly started servers running every "
                    "point's pairs: a server process's own speed (which can differ from another's for its whole "
                    "life) then averages out; each pair records its round")
    ap.add_argument("--max-pairs", type=int, default=0, help="pairs tried per arm and point at most "
                    "(default 3 x --pairs)")
    ap.add_argument("--min-prompts", type=int, default=8, help="prompts of a run: one a stream, at least this")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--server-flags", default="--max-num-seqs 64", help="extra `tandem serve` flags")
    ap.add_argument("--out-dir", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--name", default="spec_pairs", help="output files NAME.json / .md / .png")
    ap.add_argument("--report", metavar="JSON", nargs="+", help="write NAME.md / .png again from earlier runs' "
                    "JSON (several: their pairs pooled, every point of any of them)")
    ns = ap.parse_args()
    max_pairs = ns.max_pairs or 3 * ns.pairs
    out_dir = Path(ns.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if ns.report:
        done = [json.loads(Path(f).read_text()) for f in ns.report]
        pairs = [p for d in done for p in d["pairs"]]
        args = argparse.Namespace(**done[0]["meta"]["args"])
        args.concurrency = sorted({c for d in done for c in d["meta"]["args"]["concurrency"]})
        args.temperatures = sorted({t for d in done for t in d["meta"]["args"]["temperatures"]})
        names = list(dict.fromkeys(p["arm"] for p in sorted(pairs, key=lambda p: p["arm"] != "nospec_b")))
        (out_dir / f"{ns.name}.md").write_text(report(pairs, names, args) + "\n")
        plot(pairs, names, args, out_dir / f"{ns.name}.png")
        return 0
    logs = Path(tempfile.mkdtemp(prefix="tandem-bench-pairs-"))
    print(f"server logs and each run's bench serve result: {logs}", flush=True)
    table = arms(ns.methods, ns.k, ns.fixed_k, ns.aa)
    sources = base_arms(table, ns.methods, ns.base) if ns.base else {}  # --base: the adaptive arms from REV too
    names = [a for a in table if a != "nospec"]
    pairs: list[dict] = []
    commands: list[str] = []
    for rnd in range(ns.restarts):
        servers: dict = {}
        label = f"round {rnd + 1}/{ns.restarts}: " if ns.restarts > 1 else ""
        try:
            started = start_servers(servers, table, ns.server_flags, logs, sources, label=label,
                                    log_suffix=f"_r{rnd + 1}" if ns.restarts > 1 else "")
            commands += started if rnd == 0 else []
            for temp in ns.temperatures:
                for conc in ns.concurrency:
                    run_points(servers, table, names, temp, conc, rnd, ns, logs, pairs, commands, max_pairs)
        finally:
            for proc, _ in servers.values():
                stop_server(proc)
        if ns.restarts > 1:  # each set of servers' own reading: a process's speed can stay apart for its life
            for arm in names:
                mine = [q["ratio"] for q in pairs if q["round"] == rnd and q["arm"] == arm]
                if mine:
                    print(f"[round {rnd + 1}] {arm} / nospec {summarize(mine)[0]:.3f} over {len(mine)} pairs tried",
                          flush=True)
    meta = {"environment": environment(), "commands": commands, "args": vars(ns)}
    (out_dir / f"{ns.name}.json").write_text(json.dumps({"meta": meta, "pairs": pairs}, indent=1))
    summary = report(pairs, names, ns)
    (out_dir / f"{ns.name}.md").write_text(summary + "\n")
    print(summary)
    plot(pairs, names, ns, out_dir / f"{ns.name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
