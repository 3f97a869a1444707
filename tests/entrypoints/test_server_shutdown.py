"""SIGTERM under load (entrypoints/serve_cmd.py's drain): 48 streaming clients, the signal mid-way; the server
stops accepting, lets requests run for --shutdown-timeout seconds, then ends every open one. Every stream ends
with ``[DONE]`` after a final event (a finish reason, or an error event for the cut ones), the process exits 0
and its log holds no traceback."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time

import pytest

from tests.entrypoints.remote import launch

pytestmark = pytest.mark.slow

STREAMS = 48


def _stream(host: str, port: int, max_tokens: int, out: list, i: int) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=120)
    body = {"prompt": "def f(x):", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out[i] = [line[6:] for line in resp.read().decode().splitlines() if line.startswith("data: ")]


def test_sigterm_during_48_streams_ends_every_stream_and_exits_0() -> None:
    with launch("--max-num-seqs", "16", "--max-model-len", "512", "--shutdown-timeout", "1") as srv:
        host, port = srv.host_port
        events: list = [None] * STREAMS
        threads = [threading.Thread(target=_stream, args=(host, port, 4 if i % 3 == 0 else 300, events, i))
                   for i in range(STREAMS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while srv.metrics().get("vllm:num_requests_running", 0) < 16 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert srv.proc.wait(60) == 0
        ended = {"finish": 0, "error": 0}
        for lines in events:
            assert lines and lines[-1] == "[DONE]", lines
            last = json.loads(lines[-2])
            if "error" in last:
                assert last["error"]["message"] == "the server is shutting down" and last["error"]["code"] == 503
                ended["error"] += 1
            else:
                assert last["choices"][0]["finish_reason"] == "length"
                ended["finish"] += 1
        assert ended["finish"] >= 1 and ended["error"] >= 1, ended  # short ones finished in the grace; long ones cut
        log = srv.log.read_text()
        assert "Traceback" not in log and "ERROR" not in log, log[-2000:]
