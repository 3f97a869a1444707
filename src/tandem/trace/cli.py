"""``tandem trace analyze FILE [--json]``."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("trace", help="trace tools")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    a = tsub.add_parser("analyze", help="per-step overlap, idle gaps, waits, acceptance")
    a.add_argument("file")
    a.add_argument("--json", action="store_true")
    a.add_argument("--steady-reqs", type=int, default=None, help="only steps with this many requests")
    a.set_defaults(func=_analyze)


def _analyze(ns: argparse.Namespace) -> int:
    from tandem.trace.analyze import analyze_spans, format_table, load_spans

    analysis = analyze_spans(load_spans(ns.file), steady_reqs=ns.steady_reqs)
    print(json.dumps(analysis.to_json(), indent=2) if ns.json else format_table(analysis))
    return 0
