"""Tool calling through the official ``openai`` client (entrypoints/openai/tools.py, tool_parsers.py):
``tool_choice="required"`` and a named function return ``tool_calls`` whose arguments parse and validate
against the function's schema, ``finish_reason: "tool_calls"``, streamed and not — with no speculation, ngram
and eagle3, async scheduling off and on; ``"auto"`` with the Hermes parser returns the call SmolLM2 writes
after a history of earlier calls (rendered into its template, which has no tool section of its own); bad
``tools`` / ``tool_choice`` are 400s naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest

from tandem.entrypoints.openai.tool_parsers import HermesParser, JsonParser
from tests.entrypoints.remote import RemoteServer, launch

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FLAGS = ("--max-num-seqs", "4", "--max-model-len", "1024", "--num-kv-blocks", "256", "--enable-auto-tool-choice",
         "--tool-call-parser", "hermes")
CONFIGS = {
    "nospec-sync": ("--no-async-scheduling",),
    "nospec-async": ("--async-scheduling",),
    "ngram-sync": ("--no-async-scheduling", "--speculative-config",
                   '{"method": "ngram", "num_speculative_tokens": 3}'),
    "ngram-async": ("--async-scheduling", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'),
    "eagle3-sync": ("--no-async-scheduling", "--speculative-config",
                    '{"method": "eagle3", "num_speculative_tokens": 3}'),
    "eagle3-async": ("--async-scheduling", "--speculative-config",
                     '{"method": "eagle3", "num_speculative_tokens": 3}'),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def server(request: pytest.FixtureRequest) -> Iterator[RemoteServer]:
    with launch(*FLAGS, *CONFIGS[request.param]) as srv:
        yield srv


def _client(server: RemoteServer) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _check_calls(calls: list, names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-") and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("choice", ["required", "named"])
def test_required_and_named_calls_validate_streamed_and_not(server: RemoteServer, choice: str) -> None:
    client = _client(server)
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "get_weather"}}
    names = {"get_weather", "add"} if choice == "required" else {"get_weather"}
    kw = dict(model="smollm2-135m-instruct", messages=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=0,
              max_tokens=120)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    _check_calls(whole.message.tool_calls, names)
    parts = [c.choices[0] for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    assert parts[-1].finish_reason == "tool_calls" and not "".join(p.delta.content or "" for p in parts)
    streamed = [t for p in parts for t in p.delta.tool_calls or ()]
    _check_calls(streamed, names)
    assert [(t.function.name, t.function.arguments) for t in streamed] == [
        (t.function.name, t.function.arguments) for t in whole.message.tool_calls]  # greedy: the same calls
    server.wait_idle()


def test_auto_with_the_hermes_parser(server: RemoteServer) -> None:
    """Three earlier turns called get_weather (history with tool_calls and tool results): SmolLM2 calls it again;
    a question that needs no tool gets text, with no calls."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    history = []
    for i, city in enumerate(["Rome", "Oslo", "Cairo"]):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
        history += [{"role": "user", "content": f"Weather in {city}?"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"call_{i}", "content": "20 C"},
                    {"role": "assistant", "content": f"It is 20 C in {city}."}]
    client = _client(server)
    kw = dict(model="smollm2-135m-instruct", messages=[*history, {"role": "user", "content": "Weather in Tokyo?"}],
              tools=tools, temperature=0, max_tokens=40)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls] == [
        ("get_weather", {"city": "Tokyo"})]
    parts = [c.choices[0] for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    streamed = [t for p in parts for t in p.delta.tool_calls or ()]
    assert parts[-1].finish_reason == "tool_calls" and [t.function.arguments for t in streamed] == [
        whole.message.tool_calls[0].function.arguments]
    plain = client.chat.completions.create(model="smollm2-135m-instruct", tools=tools, temperature=0, max_tokens=16,
                                           messages=[{"role": "user", "content": "Say hello."}]).choices[0]
    assert plain.message.tool_calls in (None, []) and plain.message.content and plain.finish_reason in ("stop", "length")
    server.wait_idle()


def test_bad_tools_and_tool_choice_are_400s_naming_the_field(server: RemoteServer,
                                                            request: pytest.FixtureRequest) -> None:
    if request.node.callspec.params["server"] != "nospec-sync":
        pytest.skip("checked before anything reaches the engine: one configuration is enough")
    client = _client(server)
    cases = [
        (dict(tools=[{"type": "function"}]), "tools"),
        (dict(tools=[{"type": "function", "function": {"name": "has space"}}]), "tools"),
        (dict(tools=TOOLS + TOOLS[:1]), "tools"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
        (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="smollm2-135m-instruct", messages=ASK, max_tokens=4, **extra)
        assert err.value.body["param"] == param, (extra, err.value.body)
    server.wait_idle()


def test_parsers_never_raise_and_hold_back_only_what_may_be_a_call() -> None:
    hermes = HermesParser()
    content, calls = hermes.extract('Sure. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> done')
    assert content == "Sure.  done" and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1})]
    assert hermes.extract("<tool_call>{not json}</tool_call>") == ("<tool_call>{not json}</tool_call>", [])
    assert hermes.extract("no call") == ("no call", [])
    assert hermes.streamable("abc <tool") == 4 and hermes.streamable("abc <tool_call>{") == 4
    assert hermes.streamable("a < b") == 5
    js = JsonParser()
    assert [c.name for c in js.extract('[{"name": "f", "parameters": {}}, {"name": "g", "arguments": "{}"}]')[1]] == [
        "f", "g"]
    assert js.extract('{"name": 3}') == ('{"name": 3}', []) and js.streamable("{") == 0
