"""64 concurrent streaming clients against a server with async scheduling and n-gram speculation; a
quarter of them disconnect mid-stream. No 5xx, the others complete, the disconnected ones are aborted
(not run to the end), and afterwards /metrics shows no request left and every KV block free."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import openai
import pytest

from tests.entrypoints.remote import RemoteServer, config_json, launch
from tests.helpers import humaneval_prompts

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
FLAGS = ("--max-num-seqs", "32", "--max-model-len", "1024", "--speculative-config", SPEC)
NUM_CLIENTS = 64
DISCONNECT_EVERY = 4  # clients 0, 4, 8, ... leave after their second chunk
LONG = 400  # what a leaving client asks for: it could never finish before the test ends
SHORT = 16


@pytest.fixture(scope="module")
def server() -> RemoteServer:
    with launch(*FLAGS) as srv:
        yield srv


async def _client(client: openai.AsyncOpenAI, i: int, prompt: str) -> tuple[str, int]:
    leaves = i % DISCONNECT_EVERY == 0
    stream = await client.completions.create(
        model=MODEL,
        prompt=prompt,
        stream=True,
        temperature=0 if i % 2 else 0.8,
        seed=i,
        max_tokens=LONG if leaves else SHORT,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks, tokens = 0, 0
    async for chunk in stream:
        if chunk.choices:
            chunks += 1
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if leaves and chunks == 2:
            await stream.close()  # drops the connection mid-stream
            return "left", 0
    return "done", tokens


async def _run_clients(url: str, prompts: list[str]) -> list[tuple[str, int] | BaseException]:
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:
        tasks = [_client(client, i, prompts[i % len(prompts)]) for i in range(NUM_CLIENTS)]
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 240)


def test_concurrent_streams_with_disconnects(server):
    before = server.metrics()
    prompts = [p[:300] for p in humaneval_prompts(NUM_CLIENTS)]
    results = asyncio.run(_run_clients(server.url, prompts))
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]  # any 5xx would surface here as an openai.APIStatusError
    left = [r for r in results if r[0] == "left"]
    done = [r for r in results if r[0] == "done"]
    assert len(left) == NUM_CLIENTS // DISCONNECT_EVERY
    assert len(done) == NUM_CLIENTS - len(left)
    assert all(tokens == SHORT for _, tokens in done)

    after = server.wait_idle(timeout=60)
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0
    finished = after.get("vllm:request_success_total{finished_reason=length}", 0) - before.get(
        "vllm:request_success_total{finished_reason=length}", 0
    )
    assert finished == len(done)  # the leavers were aborted, never finished
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < len(done) * SHORT + len(left) * LONG // 4
    assert after["vllm:spec_decode_num_drafts_total"] > 0
    assert (
        after["vllm:spec_decode_num_draft_tokens_total"]
        >= after["vllm:spec_decode_num_accepted_tokens_total"]
    )
    assert any(
        k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{position=")
        for k in after
    )
    assert server.get("/health")[0] == 200


def test_non_streaming_disconnect_aborts(server):
    """A client that drops a non-streamed request: the request is aborted at once, its blocks freed."""
    before = server.metrics()
    host, port = server.host_port
    body = json.dumps(
        {"model": MODEL, "prompt": "def quicksort(xs):", "max_tokens": 1000, "ignore_eos": True}
    ).encode()
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 30
        while server.metrics()["vllm:num_requests_running"] == 0:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.05)
    t0 = time.monotonic()
    after = server.wait_idle(timeout=30)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert time.monotonic() - t0 < 10  # 1000 tokens would take far longer: it was aborted
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < 500


def test_async_decision_metric_matches_config(server):
    decision = config_json(*FLAGS)["async_scheduling"]
    m = server.metrics()
    key = (
        "tandem:async_scheduling_info{"
        f"reason={decision['reason']},requested={decision['requested']},"
        f"resolved={decision['resolved']}}}"
    )
    assert m.get(key) == 1.0, (key, [k for k in m if "async" in k])
