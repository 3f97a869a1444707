"""``tandem bench <name>``: benchmark subcommands, each registered by the module that implements it.

A benchmark module exposes ``register(bench_subparsers)``; add its name to ``_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib

_MODULES = ("tandem.bench.serve", "tandem.bench.ab")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="benchmarks (serve: drive a running server; ab: arms A/B/C)")
    bench = p.add_subparsers(dest="bench_command", required=True)
    for name in _MODULES:
        importlib.import_module(name).register(bench)
