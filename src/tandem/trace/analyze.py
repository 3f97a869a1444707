"""Trace analysis: turn spans into per-step facts (docs/SEMANTICS.md §4, §6).

Per step N (ids come from the span args):
- ``execute`` (track ``device``): the step's device window on the worker;
- ``schedule`` (track ``engine``): the host's scheduling of the step; ``update``: applying its output;
- ``prepare_inputs`` (track ``device``): the worker's input preparation for the step;
- waits (track ``wait``): the host blocked on the step's output, the worker on accepted counts;
- ``update`` args: draft tokens proposed and accepted in the step, as the scheduler committed them.

Derived:
- **schedule overlap** of step N: the share of ``schedule(N)`` inside ``execute(N-1)`` — the host planning the
  next step while the previous one runs. A step counts as overlapped when at least 90 % of it is inside.
- **host overlap**: the same for ``schedule(N) + prepare_inputs(N)``. On a CPU worker ``prepare_inputs`` runs on
  the worker thread after ``execute(N-1)`` finished, so it cannot overlap; the number says how much host work
  per step still sits on the critical path.
- **device idle gap** before step N: ``start(execute N) - end(execute N-1)``.
- **waits**: each wait's length and how much of it the device was busy (not reclaimable by overlap) vs idle.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tandem.trace.tracer import Span

OVERLAPPED = 0.9


def _inter(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


@dataclass
class StepFacts:
    step: int
    reqs: int = 0
    tokens: int = 0
    schedule_ns: tuple[int, int] | None = None
    execute_ns: tuple[int, int] | None = None
    prepare_ns: tuple[int, int] | None = None
    update_ns: tuple[int, int] | None = None
    wait_ns: tuple[int, int] | None = None
    drafts: int = 0
    accepted: int = 0
    verifies: int = 0  # requests whose drafts were verified this step
    schedule_overlap: float | None = None
    host_overlap: float | None = None
    device_gap_ms: float | None = None

    @property
    def execute_ms(self) -> float | None:
        return None if self.execute_ns is None else (self.execute_ns[1] - self.execute_ns[0]) / 1e6

    @property
    def rejected(self) -> int:
        return self.drafts - self.accepted


@dataclass
class WaitFacts:
    name: str
    step: int
    dur_ms: float
    device_busy_ms: float  # part of the wait while the device executed (not reclaimable)

    @property
    def exposed_ms(self) -> float:
        return self.dur_ms - self.device_busy_ms


@dataclass
class TraceAnalysis:
    steps: list[StepFacts]
    waits: list[WaitFacts]
    summary: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "steps": [
                {**asdict(s), "execute_ms": s.execute_ms, "rejected": s.rejected} for s in self.steps
            ],
            "waits": [{**asdict(w), "exposed_ms": w.exposed_ms} for w in self.waits],
        }


def load_spans(path: str | Path) -> list[Span]:
    """Spans from a Chrome trace written by :meth:`Tracer.save` (exact ns starts are kept in args)."""
    doc = json.loads(Path(path).read_text())
    spans = []
    tracks: dict[tuple[int, int], str] = {}
    for ev in doc.get("traceEvents", []):
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            tracks[(ev["pid"], ev["tid"])] = ev["args"]["name"]
    for ev in doc.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        args = dict(ev.get("args", {}))
        start = int(args.pop("start_ns", round(ev["ts"] * 1000)))
        end = start + int(round(ev["dur"] * 1000))
        track = tracks.get((ev["pid"], ev["tid"]), ev.get("cat", "?"))
        spans.append(Span(ev["name"], track, start, end, args))
    return spans


def analyze_spans(spans: list[Span], steady_reqs: int | None = None) -> TraceAnalysis:
    by_step: dict[int, StepFacts] = {}

    def facts(step: int) -> StepFacts:
        return by_step.setdefault(step, StepFacts(step))

    waits_raw: list[Span] = []
    executes: list[tuple[int, int]] = []
    for s in spans:
        step = s.args.get("step")
        if step is None:
            continue
        f = facts(int(step))
        window = (s.start_ns, s.end_ns)
        if s.name == "schedule":
            f.schedule_ns = window
            f.reqs = int(s.args.get("reqs", 0))
            f.tokens = int(s.args.get("tokens", 0))
        elif s.name == "execute":
            f.execute_ns = window
            executes.append(window)
        elif s.name == "prepare_inputs":
            f.prepare_ns = window
        elif s.name == "update":
            f.update_ns = window
            f.drafts = int(s.args.get("drafts", 0))
            f.accepted = int(s.args.get("accepted", 0))
            f.verifies = int(s.args.get("verifies", 0))
        elif s.track == "wait":
            f.wait_ns = window
            waits_raw.append(s)
    steps = [by_step[k] for k in sorted(by_step) if by_step[k].reqs > 0]
    prev: StepFacts | None = None
    for f in steps:
        if prev is not None and prev.execute_ns is not None and f.schedule_ns is not None:
            sched = f.schedule_ns
            f.schedule_overlap = _inter(sched, prev.execute_ns) / max(sched[1] - sched[0], 1)
            host = [sched] + ([f.prepare_ns] if f.prepare_ns else [])
            total = sum(b - a for a, b in host)
            f.host_overlap = sum(_inter(w, prev.execute_ns) for w in host) / max(total, 1)
            if f.execute_ns is not None:
                f.device_gap_ms = (f.execute_ns[0] - prev.execute_ns[1]) / 1e6
        prev = f
    executes.sort()
    waits = []
    for w in waits_raw:
        busy = sum(_inter((w.start_ns, w.end_ns), e) for e in executes)
        waits.append(WaitFacts(w.name, int(w.args["step"]), w.dur_ns / 1e6, busy / 1e6))
    return TraceAnalysis(steps, waits, _summarize(steps, waits, steady_reqs))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def _summarize(steps: list[StepFacts], waits: list[WaitFacts], steady_reqs: int | None) -> dict:
    steady = [s for s in steps if s.schedule_overlap is not None]
    if steady_reqs is not None:
        steady = [s for s in steady if s.reqs == steady_reqs]
    ov = [s.schedule_overlap for s in steady if s.schedule_overlap is not None]
    host = [s.host_overlap for s in steady if s.host_overlap is not None]
    gaps = [s.device_gap_ms for s in steady if s.device_gap_ms is not None]
    exe = [s.execute_ms for s in steps if s.execute_ms is not None]
    walls = []
    for a, b in zip(steps, steps[1:]):
        if a.execute_ns and b.execute_ns:
            walls.append((b.execute_ns[1] - a.execute_ns[1]) / 1e6)
    by_name: dict[str, list[WaitFacts]] = defaultdict(list)
    for w in waits:
        by_name[w.name].append(w)
    return {
        "num_steps": len(steps),
        "num_steady_steps": len(steady),
        "schedule_overlap_ratio": sum(ov) / len(ov) if ov else 0.0,
        "share_steps_overlapped": sum(o >= OVERLAPPED for o in ov) / len(ov) if ov else 0.0,
        "host_overlap_ratio": sum(host) / len(host) if host else 0.0,
        "device_idle_gap_ms_p50": _pct(gaps, 0.5),
        "device_idle_gap_ms_p90": _pct(gaps, 0.9),
        "execute_ms_p50": _pct(exe, 0.5),
        "step_wall_ms_p50": _pct(walls, 0.5),
        "step_wall_ms_p90": _pct(walls, 0.9),
        "drafts": sum(s.drafts for s in steps),
        "accepted": sum(s.accepted for s in steps),
        "verifies": sum(s.verifies for s in steps),
        "waits": {
            name: {
                "count": len(ws),
                "total_ms": sum(w.dur_ms for w in ws),
                "device_busy_ms": sum(w.device_busy_ms for w in ws),
                "exposed_ms": sum(w.exposed_ms for w in ws),
            }
            for name, ws in by_name.items()
        },
    }


def format_table(analysis: TraceAnalysis) -> str:
    s = analysis.summary
    lines = [
        f"steps: {s['num_steps']} (steady: {s['num_steady_steps']})",
        f"schedule overlap ratio: {s['schedule_overlap_ratio']:.3f}   "
        f"steps overlapped (>= {OVERLAPPED:.0%}): {s['share_steps_overlapped']:.1%}",
        f"host overlap ratio (schedule + prepare_inputs): {s['host_overlap_ratio']:.3f}",
        f"device idle gap ms p50/p90: {s['device_idle_gap_ms_p50']:.3f} / {s['device_idle_gap_ms_p90']:.3f}",
        f"execute ms p50: {s['execute_ms_p50']:.2f}   step wall ms p50/p90: "
        f"{s['step_wall_ms_p50']:.2f} / {s['step_wall_ms_p90']:.2f}",
        f"drafts: {s['drafts']}  accepted: {s['accepted']}  rejected: {s['drafts'] - s['accepted']}",
        "",
        f"{'wait':<22}{'count':>7}{'total ms':>12}{'device busy':>13}{'exposed ms':>12}",
    ]
    for name, w in s["waits"].items():
        lines.append(
            f"{name:<22}{w['count']:>7}{w['total_ms']:>12.1f}{w['device_busy_ms']:>13.1f}"
            f"{w['exposed_ms']:>12.1f}"
        )
    return "\n".join(lines)
