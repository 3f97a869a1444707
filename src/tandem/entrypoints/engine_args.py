"""Engine flags on the command line: one option per flag declared in the config (``tandem.config.engine_flags``,
vLLM's names), on every command that builds an engine, the server included; and back to ``LLM`` keywords."""

from __future__ import annotations

import argparse
from typing import Any

from tandem.config import DEFAULT_MODEL, engine_flags


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"model name, .gguf file or HF directory; default {DEFAULT_MODEL}")
    for f in engine_flags():
        if not f.cli:
            continue
        names = ["--" + f.name.replace("_", "-"), *f.aliases]
        default = f"; default {f.default}" if f.default is not None and f.kind != "bool" else ""
        kw: dict[str, Any] = {"dest": f.name, "default": None, "help": f.help + default}
        if f.kind == "bool":  # --x / --no-x; absent: the config's default
            kw["action"] = argparse.BooleanOptionalAction
        elif f.kind == "int":
            kw["type"] = int
        if f.choices:
            kw["choices"] = list(f.choices)
        g.add_argument(*names, **kw)


def engine_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """The ``LLM`` keywords of the engine flags given on the command line (left out: the defaults)."""
    kw = {f.name: getattr(ns, f.name) for f in engine_flags() if f.cli and getattr(ns, f.name) is not None}
    if getattr(ns, "trace", None):
        kw["trace_file"] = ns.trace
    return kw
