"""``/v1/embeddings`` through the official ``openai`` client, on a server started with ``--runner pooling`` (the
default model, its GGUF blocks as served): vectors within cosine 0.9999 of transformers' normalized last-token
hidden states (transformers loading the same file's tensors, tests/hf_reference.py), base64 equal to floats, token-id inputs, and the routes a
pooling server refuses."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator

import pytest
import torch

from tests.entrypoints.remote import RemoteServer, launch
from tests.hf_reference import hf_model, hf_tokenizer

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
TEXTS = ["The cat sat on the mat.", "def add(a, b):\n    return a + b", "Paris is the capital of France."]


@pytest.fixture(scope="module")
def server() -> Iterator[RemoteServer]:
    with launch("--runner", "pooling", "--max-model-len", "512", "--num-kv-blocks", "128") as srv:
        yield srv


def test_embeddings_match_transformers_pooled_hidden_states(server: RemoteServer) -> None:
    pytest.importorskip("transformers")
    from tandem.model.loader.registry import resolve_model

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    got = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.index for d in got.data] == [0, 1, 2] and got.usage.prompt_tokens > 0
    path = resolve_model(MODEL)
    tok = hf_tokenizer(path)
    model = hf_model(path, "AutoModel", dtype=torch.float32)
    for text, item in zip(TEXTS, got.data):
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            want = torch.nn.functional.normalize(model(ids).last_hidden_state[0, -1], dim=-1)
        assert float(torch.nn.functional.cosine_similarity(torch.tensor(item.embedding), want, dim=0)) >= 0.9999
    ids = tok(TEXTS[0]).input_ids
    by_ids = client.embeddings.create(model=MODEL, input=ids, encoding_format="float").data[0].embedding
    packed = client.embeddings.create(model=MODEL, input=[ids], encoding_format="base64").data[0].embedding
    floats = struct.unpack(f"<{len(by_ids)}f", base64.b64decode(packed))
    assert max(abs(a - b) for a, b in zip(floats, by_ids)) < 1e-6  # the same request shape: the same vector
    server.wait_idle()


def test_a_pooling_server_refuses_generation_and_bad_inputs(server: RemoteServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    for call, param in [
        (lambda: client.completions.create(model=MODEL, prompt="x", max_tokens=2), "model"),
        (lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}]), "model"),
        (lambda: client.embeddings.create(model=MODEL, input=[]), "input"),
        (lambda: client.embeddings.create(model=MODEL, input="x", dimensions=8), "dimensions"),
        (lambda: client.embeddings.create(model=MODEL, input=[[10**9]]), "input"),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.body["param"] == param, err.value.body
    server.wait_idle()
