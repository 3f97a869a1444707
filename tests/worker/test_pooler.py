"""The pooling runner (worker/pooler.py, ``runner="pooling"``): embeddings from the same paged model equal
transformers' pooled final hidden states (LAST and MEAN, normalized or not), with prompts split over chunked
prefill steps and batched; the async contract's first real incompatible case (``pooling_model``); generation
and pooling refuse each other's calls. A tiny random checkpoint; every test ends with the engine idle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tandem import LLM
from tandem.async_decision import AsyncReason, AsyncSchedulingError
from tests.spec_decode.tiny_heads import tiny_target

PROMPTS = [list(range(10, 30)), list(range(40, 47)), list(range(5, 60))]  # 55 tokens: 4 chunks of 16
KW = dict(max_model_len=64, num_kv_blocks=64, max_num_batched_tokens=16, max_num_seqs=4)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_target(tmp_path_factory.mktemp("pooler"))


@pytest.fixture(scope="module")
def hidden(target: Path) -> list[torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModel.from_pretrained(str(target), dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).last_hidden_state[0] for p in PROMPTS]


@pytest.mark.parametrize("pooling_type,normalize", [("LAST", True), ("MEAN", True), ("MEAN", False)])
def test_embeddings_equal_transformers_pooled_hidden_states(target: Path, hidden: list[torch.Tensor],
                                                            pooling_type: str, normalize: bool) -> None:
    llm = LLM(str(target), runner="pooling", pooler_config={"pooling_type": pooling_type, "normalize": normalize},
              **KW)
    assert llm.async_scheduling.resolved is False and llm.async_scheduling.reason is AsyncReason.POOLING_MODEL
    outs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    for p, out, h in zip(PROMPTS, outs, hidden):
        want = h[-1] if pooling_type == "LAST" else h.mean(dim=0)
        want = torch.nn.functional.normalize(want, dim=-1) if normalize else want
        got = torch.tensor(out.outputs.embedding)
        assert out.prompt_token_ids == p and got.shape == want.shape
        assert float(torch.nn.functional.cosine_similarity(got, want, dim=0)) >= 0.9999
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    sched = llm.engine.core.scheduler
    assert not sched.requests and sched.kv.all_free()
    llm.shutdown()


def test_the_async_contract_and_the_calls_each_runner_refuses(target: Path) -> None:
    with pytest.raises(AsyncSchedulingError, match="pooling_model"):
        LLM(str(target), runner="pooling", async_scheduling=True, **KW)
    with pytest.raises(ValueError, match="speculative_config does not apply"):
        LLM(str(target), runner="pooling", speculative_config={"method": "ngram", "num_speculative_tokens": 2}, **KW)
    with pytest.raises(ValueError, match="pooler_config.pooling_type must be LAST or MEAN"):
        LLM(str(target), runner="pooling", pooler_config={"pooling_type": "CLS"}, **KW)
    pooling = LLM(str(target), convert="embed", **KW)  # vLLM's spelling of the same
    cfg = pooling.llm_engine.vllm_config.scheduler_config
    assert cfg.async_scheduling is False and pooling.async_scheduling.reason.value == "pooling_model"
    with pytest.raises(ValueError, match="use embed"):
        pooling.generate("hi")
    pooling.shutdown()
    generating = LLM(str(target), **KW)
    with pytest.raises(ValueError, match="embed needs runner='pooling'"):
        generating.embed("hi")
    generating.shutdown()
    done = subprocess.run([sys.executable, "-m", "tandem.entrypoints.cli", "config", "--model", str(target),
                           "--runner", "pooling", "--json"], capture_output=True, text=True, check=True)
    plan = json.loads(done.stdout)
    assert plan["async_scheduling"] == {"requested": None, "resolved": False, "reason": "pooling_model",
                                        "detail": "runner 'pooling'"}
    assert plan["runner"] == "pooling" and plan["pooler"] == {"pooling_type": "LAST", "normalize": True}
