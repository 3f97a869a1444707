"""``draft_model`` beyond SmolLM2: ``make_draft`` exports a Gemma 3 model's first layers as a checkpoint that
tandem and transformers both read back as the same model (config fields, logits equal to the target's first
layers run directly, the same tokenizer), and the default draft follows the target: ``gemma-3-270m`` gets
``gemma-3-270m-draft`` and its greedy outputs equal no-spec, async off and on.

A tiny random Gemma 3 checkpoint (written here by transformers) runs everywhere; the real model's tests skip
without its package."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.config import SpeculativeConfig
from tandem.model.forward_batch import KVCache
from tandem.model.loader import KNOWN_MODELS, Checkpoint, load_checkpoint, resolve_model
from tandem.model.loader.tokenizer_hf import hf_tokenizer
from tandem.model.model_args import ModelArgs
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.model.transformer import CausalLM
from tandem.spec_decode.factory import build_proposer
from tandem.spec_decode.make_draft import make_draft, shipped_draft_for_target
from tests.helpers import spec_equals_reference
from tests.spec_decode.tiny_heads import tiny_gemma_target, tiny_target

transformers = pytest.importorskip("transformers")

GEMMA = "gemma-3-270m"
CODE = 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n'


def _first_layers(ckpt: Checkpoint, n: int) -> tuple[ModelArgs, dict[str, Any]]:
    """The target's first ``n`` layers with its final norm and LM head, as ModelArgs and tensors."""
    args = dataclasses.replace(
        ckpt.args, num_hidden_layers=n, layer_windows=ckpt.args.layer_windows[:n]
    )
    tensors = {
        name: t for name, t in ckpt.tensors.items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < n
    }
    return args, tensors


def _logits(args: ModelArgs, tensors: dict[str, Any], ids: list[int]) -> torch.Tensor:
    model = CausalLM.from_tensors(args, tensors, torch.float32)
    blocks = -(-len(ids) // 16)
    kv = KVCache.allocate(args.num_hidden_layers, blocks, 16, args.num_key_value_heads, args.head_dim,
                          torch.float32, torch.device("cpu"))
    batch = build_forward_batch([PagedRequest(ids, 0, list(range(blocks)))], 16, torch.device("cpu"))
    return model.compute_logits(model(batch, kv).hidden_states)


def _check_export(target: str | Path, out: Path, n: int, text: str) -> Checkpoint:
    """The export's args, logits and tokenizer against the target's first ``n`` layers."""
    ckpt = load_checkpoint(target, num_layers=n)  # the layers past n are not compared, nor read
    draft = load_checkpoint(out)
    args, tensors = _first_layers(ckpt, n)
    assert draft.args == args
    assert set(draft.tensors) == set(tensors)
    ids = ckpt.tokenizer.encode(text)
    assert torch.equal(_logits(draft.args, draft.tensors, ids), _logits(args, tensors, ids))
    tok = hf_tokenizer(out)  # tokenizer.json + tokenizer_config.json read back
    assert tok.specials == ckpt.tokenizer.specials and tok.vocab_size == ckpt.tokenizer.vocab_size
    source = ckpt.tokenizer.chat_template.source if ckpt.tokenizer.chat_template else None
    assert (tok.chat_template.source if tok.chat_template else None) == source
    for s in (text, "  two leading spaces\n\n\tand a tab", "héllo wörld 🤖", ""):
        assert tok.encode(s) == ckpt.tokenizer.encode(s)
        assert tok.decode(tok.encode(s)) == ckpt.tokenizer.decode(ckpt.tokenizer.encode(s))
    return draft


def _hf_logits(directory: Path, ids: list[int]) -> torch.Tensor:
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


# ------------------------------------------------------------------------------- tiny Gemma 3 (always)
@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gemma_target(tmp_path_factory.mktemp("gemma"))


def test_tiny_gemma_export_reads_back_in_tandem_and_transformers(tiny_gemma: Path, tmp_path: Path) -> None:
    out = make_draft(str(tiny_gemma), tmp_path / "draft", 3)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert config["sliding_window"] == 8 and config["query_pre_attn_scalar"] == 24
    assert config["hidden_activation"] == "gelu_pytorch_tanh" and config["head_dim"] == 16
    assert config["rope_parameters"] == {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    text = "the theme: " * 3  # 33 tokens: past the window of 8
    draft = _check_export(tiny_gemma, out, 3, text)
    ids = draft.tokenizer.encode(text)
    ours = _logits(draft.args, draft.tensors, ids)
    torch.testing.assert_close(_hf_logits(out, ids), ours, atol=1e-4, rtol=1e-4)


def test_default_draft_follows_the_target(tmp_path: Path) -> None:
    tiny = load_checkpoint(tiny_target(tmp_path))
    assert shipped_draft_for_target(tiny) is None
    assert shipped_draft_for_target(None) is None
    config = SpeculativeConfig(method="draft_model", num_speculative_tokens=3)
    model = CausalLM.from_tensors(tiny.args, tiny.tensors)
    with pytest.raises(ValueError, match="no draft model is shipped for"):
        build_proposer(config, target=model, target_checkpoint=tiny, num_kv_blocks=8, block_size=16)


# ------------------------------------------------------------------------------- the real Gemma 3 270M
def _require_gemma() -> None:
    if importlib.util.find_spec(KNOWN_MODELS[GEMMA].package) is None:
        pytest.skip(f"the Gemma 3 270M package is not installed ({KNOWN_MODELS[GEMMA].requirement})")


@pytest.mark.slow
def test_gemma_export_round_trip(tmp_path: Path) -> None:
    _require_gemma()
    out = make_draft(GEMMA, tmp_path / "draft", 6)
    config = json.loads((out / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert (config["sliding_window"], config["query_pre_attn_scalar"], config["head_dim"]) == (512, 256, 256)
    assert config["rope_parameters"]["full_attention"]["rope_theta"] == 1e6
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == 1e4
    draft = _check_export(GEMMA, out, 6, CODE)
    assert shipped_draft_for_target(resolve_model(GEMMA)) == "gemma-3-270m-draft"  # the file, unread
    assert shipped_draft_for_target(draft) is None  # an export is not the known target
    ids = draft.tokenizer.encode(CODE)
    ours = _logits(draft.args, draft.tensors, ids)
    theirs = _hf_logits(out, ids)
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))
    torch.testing.assert_close(theirs, ours, atol=1e-3, rtol=1e-4)  # logits reach ~50


PROMPTS = [
    'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same forwards and backwards."""\n',
    'def fizzbuzz(n: int) -> list[str]:\n    """Return the FizzBuzz sequence from 1 to n."""\n',
    'import os\n\n\ndef list_python_files(root):\n    """Yield every .py file under root."""\n',
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)
SMALL = {"max_num_seqs": 3, "max_model_len": 512, "num_kv_blocks": 768}  # 262k-wide logits rows; 6 KV groups


@pytest.mark.slow
def test_gemma_shipped_draft_equals_no_spec_async_off_and_on() -> None:
    _require_gemma()
    llm = LLM(GEMMA, async_scheduling=False, **SMALL)
    reference = [o.outputs[0] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm.shutdown()
    def the_gemma_draft(llm: LLM) -> None:
        proposer = llm.engine.core.executor.runner.proposer.inner  # the draft model behind OnHost
        assert proposer.draft.args.num_hidden_layers == 6 and proposer.draft.args.family == "gemma3"

    stats = spec_equals_reference(reference, PROMPTS, GREEDY, label="draft_model", min_identical=0,
                                  inspect=the_gemma_draft, model=GEMMA, **SMALL,
                                  speculative_config={"method": "draft_model", "num_speculative_tokens": 3,
                                                      "policy": "fixed"})
    assert stats[False] == stats[True]


def test_gemma_shipped_heads_are_found_by_target_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head directory ``gemma-3-270m-<method>`` beside the shipped ones is found for the target
    ``gemma-3-270m`` without naming a file; none is found while it is absent."""
    _require_gemma()
    from types import SimpleNamespace

    from tandem.model.loader import resolve_model
    from tandem.spec_decode import shipped

    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)
    gemma: Any = SimpleNamespace(source=resolve_model(GEMMA))
    assert shipped.shipped_head_for_target(gemma, "eagle3") is None
    (tmp_path / "gemma-3-270m-eagle3").mkdir()
    (tmp_path / "gemma-3-270m-eagle3" / "config.json").write_text("{}")
    assert shipped.shipped_head_for_target(gemma, "eagle3") == tmp_path / "gemma-3-270m-eagle3"
    assert shipped.shipped_head("gemma-3-270m-eagle3", "eagle3") == tmp_path / "gemma-3-270m-eagle3"
    assert shipped.shipped_head_for_target(gemma, "eagle") is None
    smollm2: Any = SimpleNamespace(source=resolve_model("smollm2-135m-instruct"))
    assert shipped.shipped_head_for_target(smollm2, "eagle3") is None


@pytest.mark.slow
def test_gemma_target_rejects_a_draft_with_another_vocabulary() -> None:
    _require_gemma()
    ckpt = load_checkpoint(GEMMA)
    model = CausalLM.from_tensors(ckpt.args, ckpt.tensors)
    config = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, model="smollm2-135m-instruct-draft")
    with pytest.raises(ValueError, match="has a vocabulary of 49152 tokens, the target 262144"):
        build_proposer(config, target=model, target_checkpoint=ckpt, num_kv_blocks=8, block_size=16)


def test_the_kv_budget_pays_for_the_drafters_cache(tiny_gemma: Path, tmp_path: Path) -> None:
    """A draft model pages its own cache by the target's block ids, so the one KV budget holds the target's
    pool and the drafter's cache together: the bytes both allocate stay within ``kv_cache_memory``."""
    from tandem.engine.builder import plan_engine
    from tandem.engine.llm import config_from_kwargs

    out = make_draft(str(tiny_gemma), tmp_path / "draft", 2)
    budget = 2 << 20
    spec = {"method": "draft_model", "model": str(out), "num_speculative_tokens": 2}
    plan = plan_engine(config_from_kwargs(str(tiny_gemma), kv_cache_memory=budget, speculative_config=spec), log=False)
    alone = plan_engine(config_from_kwargs(str(tiny_gemma), kv_cache_memory=budget), log=False)
    assert plan.num_kv_blocks < alone.num_kv_blocks
    target = load_checkpoint(tiny_gemma)
    model = CausalLM.from_tensors(target.args, target.tensors, torch.float32)
    kv = KVCache.allocate(
        target.args.num_hidden_layers, plan.num_kv_blocks, 16, target.args.num_key_value_heads,
        target.args.head_dim, torch.float32, "cpu", layer_tensor=model.layer_tensor,
    )
    proposer = build_proposer(
        SpeculativeConfig(**spec), target=model, target_checkpoint=target, num_kv_blocks=plan.num_kv_blocks,
        block_size=16, max_model_len=plan.max_model_len,
    )

    def nbytes(cache: KVCache) -> int:
        tensors = {t.data_ptr(): t for t in (*cache.k, *cache.v)}.values()
        return sum(t.numel() * t.element_size() for t in tensors)

    used = nbytes(kv) + nbytes(proposer.kv_cache)
    assert budget - plan.bytes_per_block < used <= budget
