"""vLLM's smaller routes and the server's lifecycle: ``/tokenize`` / ``/detokenize`` against the engine's own
tokenizer and chat template, ``GET /v1/models/{id}``, ``HEAD /health``, ``/ping``, each response's own
``created``, the start-up line naming the engine plan, a second server on a used port exiting 2 at once; and
prompt scoring (``echo``, ``max_tokens: 0``, ``prompt_logprobs``) checked against sampling's own logprobs."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tandem.model.loader import load_tokenizer
from tests.entrypoints.remote import RemoteServer, launch

pytestmark = pytest.mark.slow

MODEL = "tandem-test"
FLAGS = ("--max-num-seqs", "4", "--max-model-len", "512", "--num-kv-blocks", "128", "--served-model-name", MODEL,
         "--allowed-origins", '["https://app.example"]')


@pytest.fixture(scope="module")
def server() -> RemoteServer:
    with launch(*FLAGS) as srv:
        yield srv


def _call(server: RemoteServer, path: str, body: dict | None = None, method: str | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_tokenize_and_detokenize_use_the_engines_tokenizer(server: RemoteServer) -> None:
    tok = load_tokenizer("smollm2-135m-instruct")
    text = "def add(a, b):\n    return a + b  # héllo 🤖"
    status, doc = _call(server, "/tokenize", {"model": MODEL, "prompt": text})
    assert status == 200 and doc["tokens"] == tok.encode(text) and doc["count"] == len(doc["tokens"])
    assert doc["max_model_len"] == 512
    status, raw = _call(server, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert raw["tokens"] == tok.encode(text, add_special_tokens=False)
    chat = [{"role": "user", "content": "hi"}]
    status, doc = _call(server, "/tokenize", {"messages": chat})
    want = tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True), add_special_tokens=False)
    assert status == 200 and doc["tokens"] == want
    status, back = _call(server, "/detokenize", {"model": MODEL, "tokens": raw["tokens"]})
    assert status == 200 and back["prompt"] == text
    # bad input: a 400 naming the field, an unknown model a 404
    status, err = _call(server, "/tokenize", {"prompt": "a", "messages": chat})
    assert status == 400 and "exactly one" in err["error"]["message"]
    status, err = _call(server, "/detokenize", {"tokens": [tok.vocab_size + 5]})
    assert status == 400 and err["error"]["param"] == "tokens"
    status, err = _call(server, "/tokenize", {"model": "other", "prompt": "a"})
    assert status == 404 and err["error"]["param"] == "model"


def test_model_card_health_ping(server: RemoteServer) -> None:
    status, card = _call(server, f"/v1/models/{MODEL}")
    assert status == 200 and card["id"] == MODEL and card["max_model_len"] == 512
    assert _call(server, "/v1/models/nope")[0] == 404
    assert _call(server, "/health", method="HEAD")[0] == 200
    assert _call(server, "/ping")[0] == 200 and _call(server, "/ping", {}, method="POST")[0] == 200


def test_openapi_documents_what_the_server_answers(server: RemoteServer) -> None:
    status, raw = server.get("/openapi.json")
    spec = json.loads(raw)
    assert status == 200 and "422" not in json.dumps(spec["paths"])
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        responses = spec["paths"][path]["post"]["responses"]
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert list(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    status, err = _call(server, "/v1/completions", {"prompt": 5})  # a validation error: the documented shape
    assert status == 400 and set(err["error"]) == {"message", "type", "param", "code"}
    status, err = _call(server, "/v1/embeddings", {"input": "x"})  # a generating server: --runner pooling
    assert status == 400 and err["error"]["param"] == "model" and "--runner pooling" in err["error"]["message"]


def test_cors_answers_the_allowed_origin_only(server: RemoteServer) -> None:
    host, port = server.host_port
    conn = http.client.HTTPConnection(host, port, timeout=10)
    for origin, allowed in (("https://app.example", True), ("https://other.example", False)):
        conn.request("OPTIONS", "/v1/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
        resp = conn.getresponse()
        resp.read()
        assert (resp.getheader("access-control-allow-origin") == origin) is allowed
        conn.request("GET", "/v1/models", headers={"Origin": origin})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200 and (resp.getheader("access-control-allow-origin") == origin) is allowed


def test_each_response_has_its_own_created(server: RemoteServer) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    before = int(time.time())
    status, doc = _call(server, "/v1/completions", body)
    assert status == 200 and before <= doc["created"] <= int(time.time())
    status, chat = _call(server, "/v1/chat/completions",
                         {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    assert status == 200 and before <= chat["created"] <= int(time.time())


def test_start_up_line_and_a_used_port(server: RemoteServer) -> None:
    log = server.log.read_text()
    assert "model=smollm2-135m-instruct dtype=float32 device=cpu" in log and "kv_blocks=128" in log
    assert "speculative=none executor=uni" in log
    host, port = server.host_port
    t = time.monotonic()
    # vLLM's module entry point, positional model and flag spellings (vllm serve's): parsed, then the port
    done = subprocess.run(
        [sys.executable, "-m", "tandem.entrypoints.openai.api_server", "smollm2-135m-instruct", "--host", host,
         "--port", str(port), "--gpu-memory-utilization", "0.5", "--enforce-eager", "--max_model_len=1024",
         "--served-model-name", "m"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2 and time.monotonic() - t < 10
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tandem serve: cannot listen on {host}:{port}"), done.stderr


def test_vllm_metric_names_and_a_disconnect_counts_as_abort(server: RemoteServer) -> None:
    import socket

    host, port = server.host_port
    body = json.dumps({"model": MODEL, "prompt": "def f(x):", "max_tokens": 400, "stream": True,
                       "ignore_eos": True}).encode()
    s = socket.create_connection((host, port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    seen = b""
    while b"data:" not in seen:  # the headers, then the first event: streaming has begun
        chunk = s.recv(65536)
        assert chunk, seen
        seen += chunk
    s.close()
    m = server.wait_idle()
    assert m.get("vllm:request_success_total{finished_reason=abort}", 0) >= 1, sorted(m)
    info = [k for k in m if k.startswith("vllm:cache_config_info{")]
    assert info and "num_gpu_blocks=128" in info[0] and "block_size=16" in info[0]
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:inter_token_latency_seconds_count", "tandem:engine_healthy"):
        assert name in m, name


# -- prompt scoring: echo, max_tokens 0, prompt_logprobs -----------------------------------------------------
SCORE_PROMPT = "def add(a, b):\n    return"


def test_prompt_scoring_agrees_with_sampling(server):
    """The logprob echo reports for a prompt token equals the one sampling reported when it produced that
    token: the greedy next token of P, scored as the last token of P + [it]."""
    status, gen = _call(server, "/v1/completions", {"model": MODEL, "prompt": SCORE_PROMPT, "max_tokens": 1,
                                                      "temperature": 0, "logprobs": 2})
    assert status == 200
    sampled_lp = gen["choices"][0]["logprobs"]["token_logprobs"][0]
    ids = _call(server, "/tokenize", {"model": MODEL, "prompt": SCORE_PROMPT})[1]["tokens"]
    nxt = _call(server, "/tokenize", {"model": MODEL, "prompt": SCORE_PROMPT + gen["choices"][0]["text"],
                                      "add_special_tokens": True})[1]["tokens"]
    status, scored = _call(server, "/v1/completions", {"model": MODEL, "prompt": nxt, "max_tokens": 0,
                                                         "echo": True, "logprobs": 2, "prompt_logprobs": 2})
    assert status == 200
    choice = scored["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(nxt) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v <= 0 for v in lp["token_logprobs"][1:])
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(nxt))]
    assert choice["text"] == "".join(lp["tokens"])  # the prompt alone: max_tokens 0 drops the computed token
    assert scored["usage"]["completion_tokens"] == 0 and scored["usage"]["prompt_tokens"] == len(nxt)
    assert nxt[: len(ids)] == ids and len(nxt) == len(ids) + 1  # this text round-trips to P + [token]
    assert lp["token_logprobs"][-1] == pytest.approx(sampled_lp, abs=1e-4)
    # vLLM's prompt_logprobs field: None first, then {id: {logprob, rank, decoded_token}} holding the token.
    plp = choice["prompt_logprobs"]
    assert len(plp) == len(nxt) and plp[0] is None
    for tid, entry, value in zip(nxt[1:], plp[1:], lp["token_logprobs"][1:]):
        assert entry[str(tid)]["logprob"] == pytest.approx(value, abs=1e-6)


def test_echo_streamed_equals_whole(server):
    body = {"model": MODEL, "prompt": SCORE_PROMPT, "max_tokens": 6, "temperature": 0, "echo": True,
            "logprobs": 1}
    status, whole = _call(server, "/v1/completions", body)
    assert status == 200 and whole["choices"][0]["text"].startswith(SCORE_PROMPT)
    req = urllib.request.Request(server.url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    text, tokens = "", []
    with urllib.request.urlopen(req, timeout=60) as resp:
        for line in resp:
            line = line.strip()
            if line.startswith(b"data: {"):
                c = json.loads(line[6:])["choices"][0]
                text += c["text"]
                tokens += c["logprobs"]["tokens"]
    assert text == whole["choices"][0]["text"] and tokens == whole["choices"][0]["logprobs"]["tokens"]


def test_max_tokens_zero_needs_echo(server):
    status, err = _call(server, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0})
    assert status == 400 and err["error"]["param"] == "max_tokens"
