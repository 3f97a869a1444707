"""Weight-only int8 (``quantization="int8"``) for any checkpoint: tiny random safetensors checkpoints of
every family, the native stack and the torch reference on the same int8 matrices, the engine, the plan's
resident bytes and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.engine.builder import plan_engine
from tandem.engine.llm import config_from_kwargs
from tandem.model import CausalLM, KVCache
from tandem.model.loader import load_checkpoint
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.model.quant import Int8Weight
from tandem.quantization import resolve_quantization
from tests.model.test_loader_hf import save_tiny

pytest.importorskip("transformers")


def _logits(model: CausalLM, steps: int = 3) -> list[torch.Tensor]:
    """A prefill of two prompts, then decode steps of both (the native stack where it runs)."""
    a = model.args
    cache = KVCache.allocate(a.num_hidden_layers, 16, 4, a.num_key_value_heads, a.head_dim, torch.float32, "cpu")
    toks = {"A": [5, 17, 42, 99, 7, 3, 250], "B": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}
    blocks = {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7]}
    done = {"A": 0, "B": 0}
    out = []
    for step in range(steps + 1):
        reqs = [PagedRequest(ids[done[r]:] if step == 0 else ids[-1:], done[r] if step == 0 else len(ids) - 1, blocks[r])
                for r, ids in toks.items()]
        batch = build_forward_batch(reqs, 4, "cpu", last_token_logits_only=True)
        logits = model.compute_logits(model(batch, cache).hidden_states[batch.logits_indices])
        out.append(logits)
        for r, lg in zip(toks, logits):
            done[r] = len(toks[r])
            toks[r] = toks[r] + [int(lg.argmax())]
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_int8_matrices_stay_close_to_float32_and_every_path_agrees(tmp_path: Path, family: str) -> None:
    directory, _ = save_tiny(tmp_path, family)
    ckpt = load_checkpoint(directory)
    m8 = CausalLM.from_tensors(ckpt.args, ckpt.tensors, int8_weights=True)
    ref8 = CausalLM.from_tensors(ckpt.args, ckpt.tensors, int8_weights=True, linear_kernels="torch")
    ref8._native, ref8._native_resolved = None, True  # the torch layers on the dequantized int8 matrices
    mf = CausalLM.from_tensors(ckpt.args, ckpt.tensors)
    layer = m8.layers[0]
    assert all(isinstance(w, Int8Weight) for w in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))
    assert isinstance(m8.embed_tokens, torch.Tensor) and m8.embed_tokens.dtype == torch.float32
    for a, b, f in zip(_logits(m8), _logits(ref8), _logits(mf)):
        scale = float(f.abs().max())
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * scale)  # the same int8 matrices, two paths
        assert float((a - f).abs().max()) <= 0.05 * scale  # weight rounding: <= half a step of max|w[o]| / 127


def test_engine_runs_int8_and_reports_its_bytes(tmp_path: Path) -> None:
    directory, _ = save_tiny(tmp_path, "llama")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM(str(directory), quantization="int8", max_num_seqs=2, block_size=4, num_kv_blocks=32) as llm:
        plan = llm.engine_plan
        assert (plan.quantization.resolved, plan.quantization.reason) == ("int8", "explicit")
        outs = llm.generate([{"prompt_token_ids": [5, 17, 42]}, {"prompt_token_ids": [1, 2, 3, 4, 5]}], params)
        assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
        ckpt = load_checkpoint(directory)
        model = CausalLM.from_tensors(ckpt.args, ckpt.tensors, int8_weights=True)
        assert plan.weight_bytes == model.weight_nbytes()
        assert plan.weight_bytes < CausalLM.from_tensors(ckpt.args, ckpt.tensors).weight_nbytes()


def test_int8_refusals_name_the_reason() -> None:
    kw = {"quantized_gguf": False, "device": "cpu", "tensor_parallel_size": 1}
    assert resolve_quantization("int8", dtype="float32", **kw).resolved == "int8"
    assert resolve_quantization(None, dtype="float32", **kw).resolved == "none"  # auto never picks int8
    with pytest.raises(ValueError, match="quantization 'int8'.*dtype"):
        resolve_quantization("int8", dtype="bfloat16", **kw)
    with pytest.raises(ValueError, match="quantization 'int8'.*tensor_parallel"):
        resolve_quantization("int8", dtype="float32", **{**kw, "tensor_parallel_size": 2})
    with pytest.raises(ValueError, match="quantization 'int8'.*device"):
        resolve_quantization("int8", dtype="float32", **{**kw, "device": "cuda"})
    with pytest.raises(ValueError, match="quant_activations 'int8x2' needs quantization 'gguf'"):
        plan_engine(config_from_kwargs(quantization="int8", quant_activations="int8x2"), log=False)
