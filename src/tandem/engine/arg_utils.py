"""vLLM's ``EngineArgs``: every engine argument as a dataclass field (tandem's flags and vLLM's others, all
defaulting to ``None`` = the engine's default), with vLLM's ``add_cli_args`` / ``from_cli_args`` /
``create_engine_config``. ``LLM(**dataclasses.asdict(args))`` and ``LLM(**vars(parser.parse_args()))`` both
work, as in vLLM's examples."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from tandem.config import DEFAULT_MODEL, FLAG_ALIASES, EngineConfig, engine_flags
from tandem.entrypoints.engine_args import add_engine_args, engine_kwargs, vllm_only_args


def _add_cli_args(parser: Any) -> Any:
    """Every engine option on ``parser`` (a parser or an argument group); returns it."""
    return add_engine_args(parser)


def _from_cli_args(cls: type, args: argparse.Namespace) -> Any:
    return cls(model=args.model, **engine_kwargs(args))


def _create_engine_config(self: Any) -> EngineConfig:
    """The engine's config (validated: an argument tandem cannot honour is a ``ValueError`` naming it)."""
    from tandem.engine.llm import config_from_kwargs

    kw = {k: v for k, v in dataclasses.asdict(self).items() if k != "model"}
    return config_from_kwargs(self.model, **kw)


def _names() -> list[str]:
    own = [f.name for f in engine_flags()]
    return own + [a for a in FLAG_ALIASES if a not in own] + [n for n, _ in vllm_only_args() if n not in own]


EngineArgs = dataclasses.make_dataclass(
    "EngineArgs",
    [("model", str, dataclasses.field(default=DEFAULT_MODEL))]
    + [(name, Any, dataclasses.field(default=None)) for name in _names()],
    namespace={
        "add_cli_args": staticmethod(_add_cli_args),
        "from_cli_args": classmethod(_from_cli_args),
        "create_engine_config": _create_engine_config,
        "__module__": __name__,
        "__doc__": __doc__,
    },
)

AsyncEngineArgs = EngineArgs  # vLLM's name for the server's; the same arguments here

__all__ = ["AsyncEngineArgs", "EngineArgs"]
