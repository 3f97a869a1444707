"""Engine flags on the command line: one option per flag declared in the config (``tandem.config.engine_flags``,
vLLM's names), on every command that builds an engine, the server included; then every other vLLM engine
argument (``tandem.vllm_args``: honoured, accepted or refused unless at vLLM's default), so a ``vllm serve`` /
``EngineArgs`` command line is taken as it is; and back to ``LLM`` keywords."""

from __future__ import annotations

import argparse
import json
from functools import cache
from typing import Any

from tandem import vllm_args
from tandem.config import DEFAULT_MODEL, FLAG_ALIASES, engine_flags

# Spelled by the top-level parser (tandem --log-level), not by each command.
_NOT_ON_COMMANDS = {"log_level"}
# vLLM-only arguments whose values are lists.
_LISTS = {"served_model_name": str, "cudagraph_capture_sizes": int, "allowed_media_domains": str,
          "ignore_patterns": str, "lora_target_modules": str, "numa_bind_nodes": int, "numa_bind_cpus": str,
          "device_ids": str, "collect_detailed_traces": str, "kv_cache_dtype_skip_layers": str,
          "sleep_preserve_parameter_names": str, "cpu_offload_params": str, "offload_params": str,
          "logits_processors": str}
_OLDER = {"swap_space": "float", "disable_log_requests": "bool"}


def _json_or_text(text: str) -> Any:
    """vLLM's config-object arguments: JSON (``'{"level": 0}'``), else the text as it is."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@cache
def vllm_only_args() -> tuple[tuple[str, str], ...]:
    """(name, annotation) of every vLLM engine argument that is not one of tandem's own flags."""
    own = {f.name for f in engine_flags()} | {"model"} | set(FLAG_ALIASES)
    rows = [(a["name"], a["type"]) for a in vllm_args.vllm_args() if a["name"] not in own]
    return tuple(rows + [(n, t) for n, t in _OLDER.items() if n not in own])


def _vllm_option(name: str, annotation: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"dest": name, "default": None}
    if name in _LISTS:
        kw.update(nargs="+", type=_LISTS[name])
    elif annotation.startswith("bool"):
        kw["action"] = argparse.BooleanOptionalAction
    elif annotation.startswith("int"):
        kw["type"] = int
    elif annotation.startswith("float"):
        kw["type"] = float
    elif not annotation.startswith("str"):
        kw["type"] = _json_or_text
    return kw


def add_engine_args(p: argparse.ArgumentParser | Any) -> Any:
    """Every engine option on ``p`` (a parser or an argument group, as vLLM's ``EngineArgs.add_cli_args``
    takes); returns ``p``."""
    g = p if isinstance(p, argparse._ArgumentGroup) else p.add_argument_group("engine")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"model name, .gguf file or HF directory; default {DEFAULT_MODEL}")
    for f in engine_flags():
        if not f.cli or f.name in _NOT_ON_COMMANDS:
            continue
        names = ["--" + f.name.replace("_", "-"), *f.aliases]
        default = f"; default {f.default}" if f.default is not None and f.kind != "bool" else ""
        kw: dict[str, Any] = {"dest": f.name, "default": None, "help": f.help + default}
        if f.kind == "bool":  # --x / --no-x; absent: the config's default
            kw["action"] = argparse.BooleanOptionalAction
        elif f.kind in ("int", "float"):
            kw["type"] = int if f.kind == "int" else float
        if f.choices:
            kw["choices"] = list(f.choices)
        g.add_argument(*names, **kw)
    v = g if g is p else p.add_argument_group(
        "vLLM engine arguments", "vLLM's other engine arguments, answered: docs/VLLM_ARGS.md")
    defaults = {a["name"]: a.get("default", a.get("default_expr")) for a in vllm_args.vllm_args()}
    for name, annotation in vllm_only_args():
        answer = vllm_args.ANSWERS[name]
        kind = {"default_only": "taken at vLLM's default only", "accepted": "accepted"}.get(answer.kind, "honoured")
        text = f"vLLM's; {kind}: {answer.meaning}; vLLM's default {defaults.get(name)!r}"
        v.add_argument("--" + name.replace("_", "-"), help=text.replace("%", "%%"), **_vllm_option(name, annotation))
    return p


def engine_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """The ``LLM`` keywords of the engine options given on the command line (left out: the defaults)."""
    kw = {f.name: getattr(ns, f.name) for f in engine_flags()
          if f.cli and f.name not in _NOT_ON_COMMANDS and getattr(ns, f.name) is not None}
    kw.update({n: getattr(ns, n) for n, _ in vllm_only_args() if getattr(ns, n, None) is not None})
    if getattr(ns, "trace", None):
        kw["trace_file"] = ns.trace
    return kw
