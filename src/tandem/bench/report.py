"""A/B report: per-arm medians with spread over repeats, the output-identity check, plots.

Writes ``report.json`` (everything, per run), ``report.md`` (the contract and a table per metric) and
PNG plots: step-time distribution per arm, overlap per step, acceptance histogram, TPOT CDF.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def _run_metrics(run: Any) -> dict[str, float]:
    a = run.analysis
    steps = run.steps
    drafts = sum(s["drafts"] for s in steps)
    accepted = sum(s["accepted"] for s in steps)
    verifies = sum(s.get("verifies", 0) for s in steps)
    walls = [s["execute_ms"] + (s["device_gap_ms"] or 0.0) for s in steps if s["execute_ms"]]
    waits = a.get("waits", {})
    m = {
        "output_tok_s": run.throughput,
        "duration_s": run.duration_s,
        "ttft_ms_p50": 1e3 * _pct(run.ttft_s, 0.5),
        "ttft_ms_p90": 1e3 * _pct(run.ttft_s, 0.9),
        "ttft_ms_p99": 1e3 * _pct(run.ttft_s, 0.99),
        "tpot_ms_p50": 1e3 * _pct(run.tpot_s, 0.5),
        "tpot_ms_p90": 1e3 * _pct(run.tpot_s, 0.9),
        "tpot_ms_p99": 1e3 * _pct(run.tpot_s, 0.99),
        "itl_ms_p50": 1e3 * _pct(run.itl_s, 0.5),
        "itl_ms_p90": 1e3 * _pct(run.itl_s, 0.9),
        "itl_ms_p99": 1e3 * _pct(run.itl_s, 0.99),
        "step_wall_ms_p50": _pct(walls, 0.5),
        "step_wall_ms_p90": _pct(walls, 0.9),
        "schedule_overlap_ratio": a.get("schedule_overlap_ratio", float("nan")),
        "share_steps_overlapped": a.get("share_steps_overlapped", float("nan")),
        "device_idle_gap_ms_p50": a.get("device_idle_gap_ms_p50", float("nan")),
        "exposed_wait_ms": sum(w["exposed_ms"] for w in waits.values()),
        "wait_accepted_counts_ms": waits.get("wait_accepted_counts", {}).get("total_ms", 0.0),
        "proposed": float(drafts),
        "accepted": float(accepted),
        "rejected": float(drafts - accepted),
        "acceptance_rate": accepted / drafts if drafts else float("nan"),
        "mean_acceptance_length": 1 + accepted / verifies if verifies else float("nan"),
        "preemptions": float(run.preemptions),
        "errors": float(run.errors),
        "placeholders_left": float(run.placeholders_left),
    }
    return m


def summarize(runs: list[Any], arms: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for arm in arms:
        per = [_run_metrics(r) for r in runs if r.arm == arm]
        out[arm] = {
            k: {
                "median": statistics.median([p[k] for p in per]),
                "min": min(p[k] for p in per),
                "max": max(p[k] for p in per),
            }
            for k in per[0]
        }
    return out


def identity(runs: list[Any], arms: list[str]) -> dict[str, Any]:
    ref = next(r for r in runs if r.arm == arms[0])
    checks = {}
    for r in runs:
        same = sum(1 for k, v in r.tokens.items() if ref.tokens.get(k) == v)
        checks[f"{r.arm}#{r.repeat}"] = {"identical": same, "of": len(ref.tokens)}
    all_same = all(c["identical"] == c["of"] for c in checks.values())
    return {"reference": f"{ref.arm}#{ref.repeat}", "all_identical": all_same, "runs": checks}


def write_report(result: dict[str, Any], out: Path, arm_defs: dict[str, Any], plots: bool = True) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    runs, contract = result["runs"], result["contract"]
    arms = contract["arms"]
    summary = summarize(runs, arms)
    ident = identity(runs, arms)
    doc = {
        "contract": contract,
        "arms": {a: arm_defs[a][0] for a in arms},
        "summary": summary,
        "output_identity": ident,
        "runs": [asdict(r) for r in runs],
    }
    (out / "report.json").write_text(json.dumps(doc, indent=2, default=float))
    figures = _plots(runs, arms, arm_defs, out) if plots else []
    md = _markdown(contract, summary, ident, arms, arm_defs, figures)
    path = out / "report.md"
    path.write_text(md)
    return path


_ROWS = [
    ("output_tok_s", "output throughput (tok/s)", ".1f"),
    ("tpot_ms_p50", "TPOT p50 (ms)", ".1f"),
    ("tpot_ms_p90", "TPOT p90 (ms)", ".1f"),
    ("ttft_ms_p50", "TTFT p50 (ms)", ".0f"),
    ("ttft_ms_p99", "TTFT p99 (ms)", ".0f"),
    ("itl_ms_p50", "ITL p50 (ms)", ".1f"),
    ("itl_ms_p99", "ITL p99 (ms)", ".1f"),
    ("step_wall_ms_p50", "step wall p50 (ms)", ".1f"),
    ("step_wall_ms_p90", "step wall p90 (ms)", ".1f"),
    ("schedule_overlap_ratio", "schedule overlap ratio", ".2f"),
    ("share_steps_overlapped", "steps overlapped (>= 90 %)", ".0%"),
    ("device_idle_gap_ms_p50", "device idle gap p50 (ms)", ".3f"),
    ("exposed_wait_ms", "exposed wait (ms, device idle)", ".1f"),
    ("wait_accepted_counts_ms", "wait on accepted counts (ms)", ".1f"),
    ("proposed", "draft tokens proposed", ".0f"),
    ("accepted", "accepted", ".0f"),
    ("rejected", "rejected", ".0f"),
    ("acceptance_rate", "acceptance rate", ".3f"),
    ("mean_acceptance_length", "mean acceptance length", ".2f"),
    ("preemptions", "preemptions", ".0f"),
    ("errors", "errors", ".0f"),
    ("placeholders_left", "placeholders left after run", ".0f"),
]


def _fmt(v: float, spec: str) -> str:
    return "n/a" if v != v else format(v, spec)


def _markdown(contract: dict, summary: dict, ident: dict, arms: list[str], arm_defs: dict,
              figures: list[str]) -> str:
    lines = ["# tandem A/B report", "", "## Arms"]
    lines += [f"- **{a}**: {arm_defs[a][0]}" for a in arms]
    lines += ["", "## Contract", "", "```json", json.dumps(contract, indent=2), "```", "",
              "## Results (median over repeats, [min – max])", ""]
    lines.append("| metric | " + " | ".join(arms) + " |")
    lines.append("|---|" + "---|" * len(arms))
    for key, label, spec in _ROWS:
        cells = []
        for a in arms:
            s = summary[a][key]
            cell = _fmt(s["median"], spec)
            if s["min"] != s["max"]:
                cell += f" [{_fmt(s['min'], spec)} – {_fmt(s['max'], spec)}]"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    base = summary[arms[0]]["output_tok_s"]["median"]
    lines += ["", "Throughput ratio vs arm " + arms[0] + ": " + ", ".join(
        f"{a} {summary[a]['output_tok_s']['median'] / base:.3f}x" for a in arms)]
    lines += ["", "## Output identity", "",
              f"All runs identical to {ident['reference']}: **{ident['all_identical']}**", ""]
    lines += [f"- {k}: {v['identical']}/{v['of']}" for k, v in ident["runs"].items()]
    if figures:
        lines += ["", "## Plots", ""] + [f"![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def _plots(runs: list[Any], arms: list[str], arm_defs: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = {r.arm: r for r in runs}  # the last repeat of each arm
    names = []

    fig, ax = plt.subplots(figsize=(7, 4))
    data = [[s["execute_ms"] + (s["device_gap_ms"] or 0) for s in last[a].steps if s["execute_ms"]]
            for a in arms]
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(arms) + 1), [f"{a}: {arm_defs[a][0]}" for a in arms], fontsize=8)
    ax.set_ylabel("step wall time (ms)")
    ax.set_title("Step-time distribution per arm")
    names.append(_save(fig, out, "step_time.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for a in arms:
        ys = [s["overlap"] for s in last[a].steps if s["overlap"] is not None]
        ax.plot(range(len(ys)), ys, label=f"{a}: {arm_defs[a][0]}", lw=1)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("share of schedule(N+1) inside execute(N)")
    ax.set_title("Overlap per step")
    ax.legend(fontsize=8)
    names.append(_save(fig, out, "overlap.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(arms)
    for i, a in enumerate(arms):
        counts: dict[int, int] = {}
        for s in last[a].steps:
            if s["drafts"]:
                counts[s["accepted"]] = counts.get(s["accepted"], 0) + 1
        if counts:
            xs = sorted(counts)
            ax.bar([x + i * width for x in xs], [counts[x] for x in xs], width, label=a)
    ax.set_xlabel("accepted draft tokens per verify step (all requests of the step)")
    ax.set_ylabel("steps")
    ax.set_title("Acceptance histogram")
    ax.legend(fontsize=8)
    names.append(_save(fig, out, "acceptance.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for a in arms:
        xs = sorted(1e3 * t for r in runs if r.arm == a for t in r.tpot_s)
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{a}: {arm_defs[a][0]}")
    ax.set_xlabel("TPOT (ms)")
    ax.set_ylabel("CDF")
    ax.set_title("TPOT CDF (all repeats)")
    ax.legend(fontsize=8)
    names.append(_save(fig, out, "tpot_cdf.png"))
    return names


def _save(fig: Any, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name
