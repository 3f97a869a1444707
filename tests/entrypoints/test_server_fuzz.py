"""Hypothesis-generated malformed requests (garbage bytes, non-object JSON, objects with wrong types or
out-of-range values, unknown models) against a server with an API key: every answer is a 4xx with an
OpenAI-style error body, never a 5xx, and the server stays healthy and serves afterwards. Also: valid
but extreme sampling values never break the engine, and the API key is enforced."""

from __future__ import annotations

import http.client
import json

import openai
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.entrypoints.remote import RemoteServer, config_json, launch

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
KEY = "fuzz-secret"
FLAGS = ("--max-num-seqs", "16", "--max-model-len", "256", "--no-async-scheduling")
NUM_MALFORMED = 600
PATHS = ("/v1/completions", "/v1/chat/completions")

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# (field, value) pairs that make a body invalid whatever else it holds
_INVALID_ANY = [
    ("temperature", -1.0),
    ("temperature", "hot"),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_k", -2),  # 0 is vLLM's "off", as -1
    ("top_k", -7),
    ("min_p", 2.0),
    ("n", 0),
    ("n", 10_000),
    ("n", "2"),
    ("max_tokens", 0),
    ("max_tokens", -3),
    ("max_tokens", 10**6),
    ("max_tokens", "16"),
    ("max_tokens", 2**80),
    ("seed", 2**80),
    ("seed", 1.5),
    ("logprobs", -1),
    ("presence_penalty", 3.0),
    ("frequency_penalty", -2.5),
    ("repetition_penalty", 0.0),
    ("stop", [1, 2]),
    ("stop", [""]),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [10**9]),
    ("ignore_eos", "yes"),
    ("stream", "true"),
    ("stream_options", [1]),
    ("model", "gpt-4"),
    ("model", 42),
    ("logit_bias", {"1": 1000}),
    ("logit_bias", {"x": 1.0}),
    ("min_tokens", -1),
]
INVALID = {
    "/v1/completions": st.sampled_from(
        _INVALID_ANY
        + [
            ("logprobs", 21),
            ("prompt", []),
            ("prompt", ""),
            ("prompt", [10**9]),
            ("prompt", [[]]),
            ("prompt", {"text": "x"}),
            ("prompt", "x" * 3000),
            ("prompt", None),
            ("echo", [1]),
            ("prompt", "lone \ud800 surrogate"),
        ]
    ),
    "/v1/chat/completions": st.sampled_from(
        _INVALID_ANY
        + [
            ("top_logprobs", 30),
            ("logprobs", 3),
            ("tools", [{"type": "function"}]),
            ("tools", {"name": "f"}),
            ("tool_choice", "sometimes"),
            ("tool_choice", {"type": "function", "function": {"name": "nope"}}),
            ("messages", []),
            ("messages", "hi"),
            ("messages", [{"role": "robot", "content": "hi"}]),
            ("messages", [{"content": "hi"}]),
            ("messages", [{"role": "user", "content": [{"type": "image_url", "url": "x"}]}]),
            ("max_completion_tokens", 10**6),
            ("messages", [{"role": "user", "content": "lone \ud800 surrogate"}]),
        ]
    ),
}
FIELDS = st.sampled_from(
    [
        "prompt",
        "messages",
        "model",
        "n",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "logprobs",
        "stream",
        "stream_options",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "ignore_eos",
        "logit_bias",
        "echo",
        "top_logprobs",
        "max_completion_tokens",
        "min_tokens",
    ]
)


@st.composite
def malformed(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(PATHS))
    kind = draw(st.sampled_from(["bytes", "json", "object", "object"]))
    if kind == "bytes":
        return path, draw(st.binary(max_size=64))
    if kind == "json":
        value = draw(json_any.filter(lambda v: not isinstance(v, dict)))
        return path, json.dumps(value).encode()
    body = draw(st.dictionaries(FIELDS, json_any, max_size=5))
    if path.endswith("chat/completions"):
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    else:
        body.setdefault("prompt", "hello")
    field, value = draw(INVALID[path])
    body[field] = value
    if field == "max_tokens":
        body.pop("echo", None)  # max_tokens 0 is valid with echo (prompt scoring)
    return path, json.dumps(body).encode()


@pytest.fixture(scope="module")
def server() -> RemoteServer:
    with launch(*FLAGS, "--api-key", KEY) as srv:
        yield srv


class _Conn:
    """One keep-alive connection; reconnects if the server closed it."""

    def __init__(self, server: RemoteServer) -> None:
        self.host, self.port = server.host_port
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)

    def post(self, path: str, body: bytes, key: str | None = KEY) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        for attempt in range(2):
            try:
                self.conn.request("POST", path, body, headers)
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _check_error(status: int, raw: bytes, allowed: tuple[int, ...]) -> None:
    assert status in allowed, (status, raw[:300])
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status


def test_malformed_requests(server):
    conn = _Conn(server)
    statuses: list[int] = []

    @settings(
        max_examples=NUM_MALFORMED,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(malformed())
    def one(case: tuple[str, bytes]) -> None:
        path, body = case
        status, raw = conn.post(path, body)
        statuses.append(status)
        _check_error(status, raw, (400, 404))

    one()
    assert len(statuses) >= 500
    assert server.get("/health")[0] == 200
    assert server.wait_idle(timeout=30)["vllm:num_requests_running"] == 0
    status, raw = conn.post(
        "/v1/completions",
        json.dumps(
            {"model": MODEL, "prompt": "hello", "max_tokens": 3, "ignore_eos": True}
        ).encode(),
    )
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3


def test_extreme_valid_values(server):
    conn = _Conn(server)
    values = st.fixed_dictionaries(
        {"prompt": st.just("x = "), "max_tokens": st.integers(1, 3)},
        optional={
            "temperature": st.floats(0, 100),
            "top_p": st.floats(1e-6, 1.0),
            "top_k": st.integers(-1, 2**31 - 1).filter(lambda k: k != 0),
            "min_p": st.floats(0, 1),
            "seed": st.integers(-(2**63), 2**63 - 1),
            "repetition_penalty": st.floats(1e-3, 1e3),
            "presence_penalty": st.floats(-2, 2),
            "frequency_penalty": st.floats(-2, 2),
            "min_tokens": st.integers(0, 1),
            "logit_bias": st.dictionaries(
                st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=3
            ),
            "logprobs": st.integers(0, 20),
            "n": st.integers(1, 3),
        },
    )

    @settings(
        max_examples=25,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(values)
    def one(body: dict) -> None:
        status, raw = conn.post("/v1/completions", json.dumps(body).encode())
        assert status == 200, (status, raw[:300], body)

    one()
    assert server.get("/health")[0] == 200


def test_api_key(server):
    conn = _Conn(server)
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    for key in (None, "wrong", KEY + "x", ""):
        status, raw = conn.post("/v1/completions", body, key=key)
        _check_error(status, raw, (401,))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert server.get("/health")[0] == 200  # operational routes stay open
    assert server.get("/metrics")[0] == 200


def test_async_decision_metric_matches_config(server):
    decision = config_json(*FLAGS)["async_scheduling"]
    assert decision["requested"] is False and decision["resolved"] is False
    key = (
        "tandem:async_scheduling_info{"
        f"reason={decision['reason']},requested={decision['requested']},"
        f"resolved={decision['resolved']}}}"
    )
    assert server.metrics().get(key) == 1.0
