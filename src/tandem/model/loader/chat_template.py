"""Rendering a model's Jinja chat template the way Hugging Face tokenizers do.

Templates are written against transformers' conventions, so the environment matches them:
``trim_blocks`` and ``lstrip_blocks`` on, the ``loopcontrols`` extension, a ``tojson`` filter that
keeps non-ASCII characters and does not HTML-escape, ``raise_exception(msg)`` and
``strftime_now(fmt)`` globals, and the ``{% generation %}`` block (used by templates that mark
assistant turns for training masks) rendered as its plain body. The environment is sandboxed
because a template is code shipped inside a model file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 (jinja declares it as a plain attribute)

    def parse(self, parser: jinja2.parser.Parser) -> list[nodes.Node]:
        next(parser.stream)  # the "generation" tag itself
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template. ``origin`` names where it came from, for error messages."""

    def __init__(self, source: str, origin: str = "chat template") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationBlock, "jinja2.ext.loopcontrols"],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"{origin}: invalid Jinja syntax at line {exc.lineno}: {exc}") from exc
        self.source = source
        self.origin = origin

    def __reduce__(self) -> tuple[type[ChatTemplate], tuple[str, str]]:
        # Compiled Jinja templates do not pickle; recompile from the source on the other side.
        return (ChatTemplate, (self.source, self.origin))

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages``; ``variables`` adds template globals such as
        ``bos_token`` / ``eos_token`` or ``tools``."""
        context: dict[str, Any] = dict(variables or {})
        context["messages"] = [dict(m) for m in messages]
        context["add_generation_prompt"] = add_generation_prompt
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as exc:
            raise ValueError(f"{self.origin}: rendering failed: {exc}") from exc
