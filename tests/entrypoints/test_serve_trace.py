"""``tandem serve --trace FILE`` writes the session's Chrome trace on shutdown; it analyzes."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tandem.trace.analyze import analyze_spans, load_spans
from tests.entrypoints.remote import launch

pytestmark = pytest.mark.slow


def test_serve_writes_trace(tmp_path):
    path = tmp_path / "serve-trace.json"
    with launch("--max-num-seqs", "4", "--trace", str(path)) as server:
        body = json.dumps({"model": "smollm2-135m-instruct", "prompt": "def add(a, b):",
                           "max_tokens": 8, "temperature": 0}).encode()
        for _ in range(2):
            req = urllib.request.Request(server.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                assert resp.status == 200
    summary = analyze_spans(load_spans(path)).summary
    assert summary["num_steps"] >= 8
    doc = json.loads(path.read_text())
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert {"schedule", "execute", "forward", "update"} <= names
    # what the traced engine computed with (tandem/execution.py), resolved in the server's process
    assert doc["otherData"]["execution"]["attention_backend"] == "paged_cpu"
