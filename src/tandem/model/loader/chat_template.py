"""Rendering a model's Jinja chat template the way Hugging Face tokenizers do.

Templates are written against transformers' conventions, so the environment matches them:
``trim_blocks`` and ``lstrip_blocks`` on, the ``loopcontrols`` extension, a ``tojson`` filter that
keeps non-ASCII characters and does not HTML-escape, ``raise_exception(msg)`` and
``strftime_now(fmt)`` globals, and the ``{% generation %}`` block (used by templates that mark
assistant turns for training masks) rendered as its plain body. The environment is sandboxed
because a template is code shipped inside a model file.

``DEFAULT_CHAT_TEMPLATES`` holds the templates tandem falls back to, by ``general.architecture``,
for GGUF files that carry none (Gemma 3's turn format). A template given by the user (``--chat-template``,
``LLM(chat_template=...)``, ``LLM.chat(chat_template=...)``, as in vLLM) wins over both: a file's path, or
the template text itself (:func:`user_chat_template`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
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


# Gemma's turn format, for GGUF files of the Gemma family that carry no tokenizer.chat_template.
# It renders what Gemma 3's published template (its instruction-tuned tokenizer_config.json)
# renders: "<bos>", then per message "<start_of_turn>{role}\n{content}<end_of_turn>\n" with the
# role "assistant" written "model" and the content stripped of surrounding whitespace; a system
# message is not a turn of its own but goes before the first turn's content, followed by a blank
# line; roles must alternate user/assistant; "<start_of_turn>model\n" is the generation prompt.
# Content may also be a list of parts: {"type": "text", "text": ...} (stripped) or
# {"type": "image"} ("<start_of_image>"). The template writes <bos> itself, so the rendered text
# is encoded with add_special_tokens=False, like every chat prompt in tandem.
GEMMA_CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set system = messages[0]['content'] -%}
    {%- if system is not string -%}{%- set system = system[0]['text'] -%}{%- endif -%}
    {%- set first_prefix = system + '\\n\\n' -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set first_prefix = '' -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_prefix if loop.first else '') }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- else -%}
        {%- for part in message['content'] -%}
            {%- if part['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif part['type'] == 'text' -%}
                {{ part['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\\n' }}
{%- endif -%}
"""

# general.architecture -> the chat template to use when a GGUF file has none.
DEFAULT_CHAT_TEMPLATES: Mapping[str, str] = MappingProxyType({"gemma3": GEMMA_CHAT_TEMPLATE})


def user_chat_template(value: str, origin: str = "chat_template") -> ChatTemplate:
    """A template the user passed: the contents of the file ``value`` names, or ``value`` itself when it is a
    template (it has a ``{``); a value that is neither (a path that does not exist) is a ``ValueError`` naming
    ``origin``."""
    from pathlib import Path

    path = Path(value).expanduser()
    if "{" not in value:
        if not path.is_file():
            raise ValueError(f"{origin}: {value!r} is neither a file nor a Jinja template")
        return ChatTemplate(path.read_text(), f"{origin} ({path})")
    return ChatTemplate(value, origin)
