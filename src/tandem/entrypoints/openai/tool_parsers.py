"""Tool-call parsers for ``tool_choice: "auto"`` (vLLM's ``--tool-call-parser``): they find the calls a model
wrote in its text. ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes /
Qwen / SmolLM style), the text around them the message's content; ``json``: the whole output is one call
object or a list of them (``arguments`` or ``parameters``). A parser never raises on model output: text it
cannot read stays content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


def _call(obj: Any) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except json.JSONDecodeError:
            return None
        return ParsedCall(obj["name"], args)
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolParser:
    name = ""
    # Streaming: text from this marker on is held back until the output ends (it may be a call).
    start_marker: str | None = None

    def extract(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(content, calls); no calls found: the text as it is."""
        raise NotImplementedError

    def streamable(self, text: str) -> int:
        """How much of ``text`` (the output so far) can be streamed as content now: everything before a call
        may start (``start_marker``, or a tail that could grow into it)."""
        marker = self.start_marker
        if marker is None:
            return 0
        at = text.find(marker)
        if at >= 0:
            return at
        for keep in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)


class HermesParser(ToolParser):
    name = "hermes"
    start_marker = "<tool_call>"
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def extract(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        if self.start_marker not in text:
            return text, []
        calls = []
        for m in self._BLOCK.finditer(text):
            try:
                call = _call(json.loads(m.group(1)))
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, []  # a block it cannot read: the whole text stays content
            calls.append(call)
        content = self._BLOCK.sub("", text).strip()
        return content or None, calls


class JsonParser(ToolParser):
    name = "json"
    start_marker = None  # the whole output may be the call: nothing streams as content

    def extract(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        try:
            obj = json.loads(text.strip())
        except json.JSONDecodeError:
            return text, []
        items = obj if isinstance(obj, list) else [obj]
        calls = [_call(o) for o in items]
        if not calls or any(c is None for c in calls):
            return text, []
        return None, [c for c in calls if c is not None]


TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesParser, "json": JsonParser}


def get_tool_parser(name: str) -> ToolParser:
    if name not in TOOL_PARSERS:
        raise ValueError(f"tool_call_parser must be one of {sorted(TOOL_PARSERS)}, got {name!r}")
    return TOOL_PARSERS[name]()
