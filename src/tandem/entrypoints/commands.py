"""Subcommands beyond generate / chat / config, each registered by the module that implements it."""

from __future__ import annotations

import argparse
import importlib

# module -> its ``register(subparsers)`` adds one or more subcommands
_MODULES = (
    "tandem.entrypoints.serve_cmd",
    "tandem.bench.cli",
    "tandem.trace.cli",
    "tandem.spec_decode.cli",
    "tandem.spec_decode.train.cli",
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # not built yet
        module.register(sub)
