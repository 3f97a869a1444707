"""Trace analysis on synthetic spans (exact numbers) and the CLI on a saved trace."""

from __future__ import annotations

import json

from tandem.entrypoints.cli import main
from tandem.trace.analyze import analyze_spans, load_spans
from tandem.trace.tracer import NULL_TRACER, Span, Tracer

MS = 1_000_000


def _spans(overlapped: bool) -> list[Span]:
    spans = []
    for step in range(1, 6):
        start = step * 100 * MS
        spans.append(Span("execute", "device", start, start + 90 * MS, {"step": step}))
        # schedule of step N+1: inside execute(N) when overlapped, after it otherwise
        sched = start + (10 if overlapped else 95) * MS
        spans.append(Span("schedule", "engine", sched, sched + 2 * MS,
                          {"step": step + 1, "reqs": 4, "tokens": 4}))
        spans.append(Span("wait_output", "wait", start + 20 * MS, start + 95 * MS, {"step": step}))
        spans.append(Span("update", "engine", start + 95 * MS, start + 96 * MS,
                          {"step": step, "drafts": 6, "accepted": 2}))
    spans.append(Span("schedule", "engine", 90 * MS, 92 * MS, {"step": 1, "reqs": 4, "tokens": 4}))
    return spans


def test_overlap_gaps_waits_and_acceptance():
    on = analyze_spans(_spans(True)).summary
    off = analyze_spans(_spans(False)).summary
    assert on["share_steps_overlapped"] == 1.0 and on["schedule_overlap_ratio"] == 1.0
    assert off["share_steps_overlapped"] == 0.0
    assert on["device_idle_gap_ms_p50"] == 10.0
    w = on["waits"]["wait_output"]
    assert w["count"] == 5 and abs(w["device_busy_ms"] - 5 * 70) < 1e-6
    assert abs(w["exposed_ms"] - 5 * 5) < 1e-6  # the last 5 ms of each wait: device idle
    assert on["drafts"] == 30 and on["accepted"] == 10


def test_chrome_roundtrip_and_cli(tmp_path, capsys):
    tracer = Tracer()
    tracer.extend(_spans(True))
    path = tracer.save(tmp_path / "t.json")
    doc = json.loads(path.read_text())
    assert any(e["ph"] == "X" for e in doc["traceEvents"])  # Perfetto/Chrome "complete" events
    assert analyze_spans(load_spans(path)).summary == analyze_spans(tracer.spans).summary
    assert main(["trace", "analyze", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["share_steps_overlapped"] == 1.0
    assert main(["trace", "analyze", str(path)]) == 0
    assert "schedule overlap ratio" in capsys.readouterr().out


def test_null_tracer_records_nothing():
    with NULL_TRACER.span("x", "engine", step=1) as s:
        s.args["a"] = 1
    NULL_TRACER.add("y", "device", 0, 1)
    assert NULL_TRACER.spans == []
