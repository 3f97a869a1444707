"""Tool calling on ``/v1/chat/completions``, the way vLLM serves it.

- ``tools`` reach the prompt: a chat template that renders tools itself (its source mentions ``tools``) gets
  them as the ``tools`` variable, with the history's ``tool_calls`` and ``tool`` messages as they are; a template
  without a tool section (SmolLM2's) gets them as a Hermes-style system block (:data:`FALLBACK_SYSTEM`), earlier
  calls written back as ``<tool_call>`` blocks and tool results as ``<tool_response>`` blocks.
- ``tool_choice: "required"`` and a named function are enforced by the structured-output machinery (so they
  hold under speculative decoding and async scheduling): the output is a JSON array of ``{"name",
  "parameters"}`` objects, each validated against its function's schema, or the named function's arguments.
- ``"auto"`` (the default when tools are given) needs ``--enable-auto-tool-choice`` and a
  ``--tool-call-parser``; the parser reads the calls out of free text (tool_parsers.py).
- A response with calls has ``tool_calls`` (ids ``chatcmpl-tool-…``) and ``finish_reason: "tool_calls"``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from tandem.entrypoints.openai.errors import APIError
from tandem.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, NamedToolChoice
from tandem.entrypoints.openai.tool_parsers import ParsedCall, ToolParser

FALLBACK_SYSTEM = (
    "You can call functions. Their signatures, as JSON schemas:\n<tools>\n{tools}\n</tools>\n"
    'To call a function, answer with one <tool_call>{{"name": <name>, "arguments": <arguments as JSON>}}'
    "</tool_call> block per call."
)
_NO_ARGS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # none | auto | required | named
    tools: list[dict[str, Any]]  # as OpenAI sends them, for the chat template
    named: str | None = None
    structured: dict[str, Any] | None = None  # required / named: the StructuredOutputsParams keywords
    parser: ToolParser | None = None  # auto

    @property
    def active(self) -> bool:
        return self.mode != "none"


def plan_tools(req: ChatCompletionRequest, parser: ToolParser | None) -> ToolPlan:
    """The request's tool mode, checked: every refusal is a 400 naming ``tools`` or ``tool_choice``."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools or ()]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(f"tools: function names must be unique, got {names}", 400, "tools")
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if choice == "none":
        return ToolPlan("none", [])
    if not tools:
        raise APIError(f"tool_choice {_shown(choice)} needs tools", 400, "tool_choice")
    if choice == "auto":
        if parser is None:
            raise APIError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
                           'set (or pass tool_choice "required", "none" or a named function)', 400, "tool_choice")
        return ToolPlan("auto", tools, parser=parser)
    if req.structured_outputs_kwargs() is not None:
        raise APIError(f"tool_choice {_shown(choice)} cannot be combined with response_format or "
                       "structured_outputs", 400, "tool_choice")
    schemas = {t["function"]["name"]: t["function"].get("parameters") or _NO_ARGS for t in tools}
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in schemas:
            raise APIError(f"tool_choice names function {name!r}, which is not among tools {names}", 400,
                           "tool_choice")
        return ToolPlan("named", tools, name, {"json": schemas[name]})
    one = [{"type": "object", "properties": {"name": {"type": "string", "enum": [n]}, "parameters": schema},
            "required": ["name", "parameters"]} for n, schema in schemas.items()]
    array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": one}}
    if req.parallel_tool_calls is False:
        array["maxItems"] = 1
    return ToolPlan("required", tools, None, {"json": array})


def _shown(choice: Any) -> str:
    return f"'{choice}'" if isinstance(choice, str) else f"naming {choice.function.name!r}"


def template_messages(messages: list[ChatMessage], plan: ToolPlan | None, template_source: str,
                      ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages as the chat template gets them, and the template's extra variables (``tools``)."""
    native = "tools" in template_source
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            calls = [{"id": c.id, "type": "function",
                      "function": {"name": c.function.name, "arguments": _loaded(c.function.arguments)}}
                     for c in m.tool_calls]
            if native:
                msg["tool_calls"] = calls
            else:
                blocks = [json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                     ensure_ascii=False) for c in calls]
                msg["content"] = "\n".join(filter(None, [msg["content"], *(f"<tool_call>\n{b}\n</tool_call>"
                                                                            for b in blocks)]))
        if m.role == "tool":
            if native:
                msg["tool_call_id"] = m.tool_call_id
            else:
                msg["content"] = f"<tool_response>\n{msg['content']}\n</tool_response>"
        out.append(msg)
    if plan is None or not plan.active:
        return out, {}
    if native:
        return out, {"tools": plan.tools}
    block = FALLBACK_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in plan.tools))
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out, {}


def _loaded(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _response_call(call: ParsedCall) -> dict[str, Any]:
    return {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def extract_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of one choice's output. Output that is not a call stays content: a parser
    failure, or a constrained output cut short by ``max_tokens``."""
    calls: list[ParsedCall] = []
    content: str | None = text
    if plan.mode == "auto" and plan.parser is not None:
        content, calls = plan.parser.extract(text)
    elif plan.mode in ("named", "required"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return text, []
        if plan.mode == "named":
            calls = [ParsedCall(plan.named or "", json.dumps(value, ensure_ascii=False))]
        else:
            calls = [ParsedCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in value]
        content = None
    return content, [_response_call(c) for c in calls]


def streamable(plan: ToolPlan, text: str) -> int:
    """How much of a choice's output so far may stream as content (the rest may become a call)."""
    if not plan.active:
        return len(text)
    if plan.mode == "auto" and plan.parser is not None:
        return plan.parser.streamable(text)
    return 0
