"""A span tracer on named tracks (engine, device, wait, ...), cheap when off, exportable as Chrome JSON.

Timestamps come from ``time.monotonic_ns()``: CLOCK_MONOTONIC is system-wide on Linux, so spans recorded in
a worker process line up with the engine's. ``NULL_TRACER`` makes every call a no-op (one attribute
lookup and a shared context manager), so instrumented code needs no ``if tracing`` branches.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Span:
    name: str
    track: str
    start_ns: int
    end_ns: int = 0
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "track": self.track,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "args": self.args,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Span:
        return cls(d["name"], d["track"], d["start_ns"], d["end_ns"], dict(d.get("args", {})))


class _SpanContext:
    __slots__ = ("_tracer", "span")

    def __init__(self, tracer: Tracer, span: Span) -> None:
        self._tracer = tracer
        self.span = span

    @property
    def args(self) -> dict[str, Any]:
        return self.span.args

    def __enter__(self) -> _SpanContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.span.end_ns = time.monotonic_ns()
        self._tracer.record(self.span)


class _NullSpan:
    """What a disabled tracer's span hands its caller: arguments written (small numbers) and never read."""

    __slots__ = ("args",)

    def __init__(self) -> None:
        self.args: dict[str, Any] = {}


class Tracer:
    """Collects spans; thread-safe appends (the GIL makes list.append atomic)."""

    enabled = True

    def __init__(self, process_name: str = "tandem") -> None:
        self.process_name = process_name
        self.spans: list[Span] = []
        # What the traced engine ran (e.g. its resolved ``execution``), saved as the trace's ``otherData``.
        self.metadata: dict[str, Any] = {}
        self._lock = threading.Lock()

    def span(self, name: str, track: str, **args: Any) -> _SpanContext:
        return _SpanContext(self, Span(name, track, time.monotonic_ns(), args=args))

    def record(self, span: Span) -> None:
        self.spans.append(span)

    def add(self, name: str, track: str, start_ns: int, end_ns: int, **args: Any) -> None:
        self.spans.append(Span(name, track, start_ns, end_ns, args))

    def extend(self, spans: list[Span]) -> None:
        with self._lock:
            self.spans.extend(spans)

    def take(self) -> list[Span]:
        """Remove and return the spans collected so far (worker -> engine shipping)."""
        with self._lock:
            out, self.spans = self.spans, []
        return out

    def clear(self) -> None:
        self.take()

    # -- export ----------------------------------------------------------------------------------------
    def to_chrome(self) -> dict[str, Any]:
        tracks = sorted({s.track for s in self.spans})
        tid = {t: i + 1 for i, t in enumerate(tracks)}
        pid = os.getpid()
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": self.process_name}}
        ]
        for track, i in tid.items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": i, "args": {"name": track}})
        t0 = min((s.start_ns for s in self.spans), default=0)
        for s in sorted(self.spans, key=lambda s: s.start_ns):
            events.append(
                {
                    "ph": "X",
                    "name": s.name,
                    "cat": s.track,
                    "pid": pid,
                    "tid": tid[s.track],
                    "ts": (s.start_ns - t0) / 1000.0,
                    "dur": max(s.dur_ns, 0) / 1000.0,
                    "args": {**s.args, "start_ns": s.start_ns},
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": self.metadata}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_chrome()))
        return path


class NullTracer(Tracer):
    enabled = False
    _CTX = contextlib.nullcontext(_NullSpan())  # reusable: entering it only returns the holder

    def span(self, name: str, track: str, **args: Any) -> contextlib.nullcontext[_NullSpan]:  # type: ignore[override]
        return self._CTX

    def record(self, span: Span) -> None:
        pass

    def add(self, name: str, track: str, start_ns: int, end_ns: int, **args: Any) -> None:
        pass

    def extend(self, spans: list[Span]) -> None:
        pass


NULL_TRACER = NullTracer()
