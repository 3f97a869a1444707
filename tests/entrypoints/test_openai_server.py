"""The OpenAI-compatible server through the official ``openai`` client: completions and chat, streamed
and not (same seed -> same text), stop strings, logprobs, n, usage, errors, /metrics."""

from __future__ import annotations

import http.client
import json

import openai
import pytest

from tests.entrypoints.remote import RemoteServer, config_json, launch

pytestmark = pytest.mark.slow

MODEL = "tandem-test"
FLAGS = ("--max-num-seqs", "16", "--max-model-len", "512", "--num-kv-blocks", "256")
PROMPT = "def fibonacci(n):\n    "
CHAT = [{"role": "user", "content": "Write a haiku about the sea."}]


@pytest.fixture(scope="module")
def server() -> RemoteServer:
    with launch(*FLAGS, "--served-model-name", MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _stream_completion(client: openai.OpenAI, **kw) -> tuple[dict[int, str], dict[int, str], dict]:
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage = None
    for chunk in client.completions.create(
        model=MODEL, stream=True, stream_options={"include_usage": True}, **kw
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    assert usage is not None
    return texts, reasons, usage


def test_models_health_version(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert server.get("/health")[0] == 200
    host, port = server.host_port
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/v1/models", headers={"Origin": "https://app.example"})
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200 and resp.getheader("access-control-allow-origin") is None  # CORS: off by default
    status, body = server.get("/version")
    assert status == 200 and json.loads(body)["version"]


def test_completion_stream_equals_non_stream(client):
    kw = {
        "prompt": PROMPT,
        "max_tokens": 24,
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": 1234,
        "n": 2,
    }
    full = client.completions.create(model=MODEL, **kw)
    texts, reasons, usage = _stream_completion(client, **kw)
    assert len(full.choices) == 2
    for c in full.choices:
        assert c.text == texts[c.index]
        assert c.finish_reason == reasons[c.index] == "length"
    assert full.choices[0].text != full.choices[1].text  # seeds differ per sample (seed + i)
    assert full.usage.completion_tokens == usage.completion_tokens == 48
    assert full.usage.prompt_tokens == usage.prompt_tokens > 0
    assert full.usage.total_tokens == full.usage.prompt_tokens + 48


def test_chat_stream_equals_non_stream(client):
    kw = {"messages": CHAT, "max_tokens": 20, "temperature": 0.7, "seed": 7}
    full = client.chat.completions.create(model=MODEL, **kw)
    parts, role, usage, reason = [], None, None, None
    for chunk in client.chat.completions.create(
        model=MODEL, stream=True, stream_options={"include_usage": True}, **kw
    ):
        usage = chunk.usage or usage
        for c in chunk.choices:
            role = c.delta.role or role
            parts.append(c.delta.content or "")
            reason = c.finish_reason or reason
    assert role == "assistant" and full.choices[0].message.role == "assistant"
    assert "".join(parts) == full.choices[0].message.content
    assert reason == full.choices[0].finish_reason
    assert usage.completion_tokens == full.usage.completion_tokens <= 20
    assert usage.prompt_tokens == full.usage.prompt_tokens > 10  # the chat template's tokens


def test_stop_strings(client):
    base = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0)
    text = base.choices[0].text
    stop = "return"
    assert stop in text, f"pick another stop string from {text!r}"
    cut = text[: text.index(stop)]
    kw = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0, "stop": [stop, "never-appears"]}
    full = client.completions.create(model=MODEL, **kw)
    assert full.choices[0].text == cut
    assert full.choices[0].finish_reason == "stop"
    assert full.usage.completion_tokens < 32
    texts, reasons, usage = _stream_completion(client, **kw)
    assert texts[0] == cut and reasons[0] == "stop"
    assert usage.completion_tokens == full.usage.completion_tokens
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stop=["\n", " "]
    )
    assert " " not in chat.choices[0].message.content and chat.choices[0].finish_reason == "stop"


def test_completion_logprobs(client):
    full = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3
    )
    c = full.choices[0]
    lp = c.logprobs
    n = full.usage.completion_tokens
    assert (
        len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    )
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and 3 <= len(top) <= 4
        assert top[token] == value == max(top.values())  # greedy: the sampled token is the best
    streamed_tokens = []
    for chunk in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3, stream=True
    ):
        for ch in chunk.choices:
            if ch.logprobs is not None:
                streamed_tokens += ch.logprobs.tokens
    assert streamed_tokens == lp.tokens


def test_chat_logprobs(client):
    full = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and isinstance(entry.bytes, list)
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.top_logprobs[0].token == entry.token  # greedy
    if full.choices[0].finish_reason == "length":  # no end-of-turn token (its text is skipped)
        joined = bytes(b for e in content for b in e.bytes).decode()
        assert joined == full.choices[0].message.content


def test_sampling_fields(client):
    full = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=10,
        temperature=1.0,
        top_p=0.9,
        seed=3,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2, "ignore_eos": True},
    )
    assert full.usage.completion_tokens == 10 and full.choices[0].finish_reason == "length"
    prompts = [PROMPT, "import numpy as np\n"]
    batch = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text  # greedy: both samples agree


def test_errors(server, client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    assert err.value.status_code == 404 and "no-such-model" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hi", temperature=-1.0)
    assert err.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=600)
    assert err.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="word " * 600, max_tokens=2)
    image = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": image}], max_tokens=2)
    assert err.value.body["param"] == "messages" and err.value.body["message"].startswith("images are not supported")
    host, port = server.host_port
    conn = http.client.HTTPConnection(host, port, timeout=10)
    for body in (b"{not json", b"[1, 2]", b'{"prompt": "x", "max_tokens": "3"}'):
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        assert resp.status == 400
        assert (
            set(doc["error"]) == {"message", "type", "param", "code"}
            and doc["error"]["code"] == 400
        )
    conn.close()


def test_metrics(server):
    m = server.wait_idle()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert name in m, name
    assert m["vllm:generation_tokens_total"] > 0
    assert m["vllm:time_to_first_token_seconds_count"] > 0
    # Every finished request that produced a token went through prefill, decode and inference once (queue
    # time is also known for one aborted after admission), and the phases add up: prefill + decode =
    # inference, and queue + prefill covers the time to the first token.
    count = {p: m[f"vllm:request_{p}_time_seconds_count"] for p in ("queue", "prefill", "decode", "inference")}
    total = {p: m[f"vllm:request_{p}_time_seconds_sum"] for p in count}
    ttft_n, ttft_sum = m["vllm:time_to_first_token_seconds_count"], m["vllm:time_to_first_token_seconds_sum"]
    assert count["prefill"] == count["decode"] == count["inference"] == ttft_n > 0 and count["queue"] >= ttft_n
    assert total["prefill"] + total["decode"] == pytest.approx(total["inference"], rel=1e-6)
    assert total["queue"] + total["prefill"] >= ttft_sum * (1 - 1e-6) and total["prefill"] <= ttft_sum
    assert m["vllm:kv_cache_usage_perc"] == 0 and m["vllm:num_requests_running"] == 0
    decision = config_json(*FLAGS)["async_scheduling"]
    key = (
        "tandem:async_scheduling_info{"
        f"reason={decision['reason']},requested={decision['requested']},"
        f"resolved={decision['resolved']}}}"
    )
    assert m.get(key) == 1.0, (key, [k for k in m if "async" in k])
