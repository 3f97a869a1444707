"""tandem's transformer against Hugging Face transformers on tiny random checkpoints.

Each checkpoint is built by transformers with a fixed seed (every weight re-drawn so norms and biases are
not the trivial 1/0 of a fresh init), loaded into tandem from its ``state_dict``, and run through the paged
KV cache with scattered block ids. One forward mixes every kind of query: a prefill chunk after cached
context, fresh prefills (long and short), short multi-token queries after context (a verify step) and
decodes of different lengths, including a one-token prompt. Each request's rows are compared with
transformers run on that request's whole sequence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import transformers

from tandem.model import CausalLM, KVCache, ModelArgs, ModelOutput
from tandem.model.linear import LINEAR_KERNELS, create_linear_kernels, onednn_available
from tandem.model.paged_batch import PagedRequest, build_forward_batch

VOCAB = 300


def _config(family: str, **overrides: Any) -> transformers.PretrainedConfig:
    common: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
    }
    common.update(overrides)
    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gemma3": transformers.Gemma3TextConfig,
    }[family]
    return cls(**common)


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_theta": 500000.0,
}

CONFIGS = {
    "llama-tied": lambda: _config("llama", tie_word_embeddings=True, rope_theta=10000.0),
    "llama3-rope-untied": lambda: _config(
        "llama", tie_word_embeddings=False, rope_scaling=LLAMA3_ROPE
    ),
    "qwen2-bias": lambda: _config("qwen2", tie_word_embeddings=True, rope_theta=1e6),
    "qwen3-qknorm": lambda: _config("qwen3", tie_word_embeddings=False, head_dim=32),
    # Gemma 3: sandwich norms, GELU, scaled embeddings, q/k norms, a query_pre_attn_scalar that is not
    # head_dim, and sliding-window layers (window 8, own RoPE base) beside a global one: the scenario's
    # prefills, chunks, verifies and decodes all reach past the window.
    "gemma3-window": lambda: _config(
        "gemma3", tie_word_embeddings=True, head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    ),
}


def args_from_hf(config: transformers.PretrainedConfig) -> ModelArgs:
    """``ModelArgs`` from a live config; transformers 5 nests RoPE settings in ``rope_parameters``."""
    d = config.to_dict()
    rope = d.get("rope_parameters") or {}
    if "rope_theta" in rope:
        d.setdefault("rope_theta", rope["rope_theta"])
    if rope.get("rope_type", "default") != "default":
        d["rope_scaling"] = rope
    return ModelArgs.from_hf_config(d)


def build_hf(name: str) -> transformers.PreTrainedModel:
    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=torch.float32)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif pname.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
    return model.eval()


@dataclass
class Req:
    tokens: list[int]
    blocks: list[int]
    cached: int = 0


class Scenario:
    """Requests with scattered blocks and the bookkeeping to feed them step by step."""

    def __init__(self, lengths: dict[str, int], block_size: int, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.block_size = block_size
        need = sum(-(-n // block_size) for n in lengths.values())
        pool = list(range(need + 5))
        rng.shuffle(pool)
        self.reqs: dict[str, Req] = {}
        for name, n in lengths.items():
            nb = -(-n // block_size)
            blocks, pool = pool[:nb], pool[nb:]
            self.reqs[name] = Req([rng.randrange(VOCAB) for _ in range(n)], blocks)
        self.num_blocks = need + 5

    def step(
        self, plan: list[tuple[str, int]], device: str = "cpu"
    ) -> tuple[Any, list[tuple[str, int, int]]]:
        """Feed ``n`` more tokens of each named request; returns the batch and (name, start, end) rows."""
        paged, spans = [], []
        for name, n in plan:
            r = self.reqs[name]
            paged.append(PagedRequest(r.tokens[r.cached : r.cached + n], r.cached, r.blocks))
            spans.append((name, r.cached, r.cached + n))
            r.cached += n
        return build_forward_batch(paged, self.block_size, device), spans


LENGTHS = {"A": 25, "B": 20, "C": 10, "D": 17, "E": 33, "F": 1, "G": 11, "H": 6}
STEP1 = [("A", 5), ("C", 9), ("D", 16), ("E", 32), ("G", 7)]
# Decodes (C, D, E, F), a long chunk after context (A), a long fresh prefill (B), a short query after
# context (G: a verify of 3 drafts) and a short fresh prefill (H), interleaved.
STEP2 = [("C", 1), ("A", 20), ("F", 1), ("G", 4), ("D", 1), ("B", 20), ("E", 1), ("H", 6)]


def _to_cpu(out: ModelOutput) -> ModelOutput:
    return ModelOutput(out.hidden_states.cpu(), [a.cpu() for a in out.aux_hidden_states])


def hf_reference(model: Any, tokens: list[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    with torch.no_grad():
        out = model(torch.tensor([tokens]), output_hidden_states=True)
    return out.logits[0].float(), tuple(h[0] for h in out.hidden_states)


def run_scenario(
    name: str, dtype: torch.dtype, block_size: int, device: str = "cpu"
) -> dict[str, Any]:
    hf = build_hf(name)
    args = args_from_hf(hf.config)
    model = CausalLM.from_tensors(args, hf.state_dict(), dtype=dtype, device=device)
    sc = Scenario(LENGTHS, block_size)
    cache = KVCache.allocate(
        args.num_hidden_layers,
        sc.num_blocks,
        block_size,
        args.num_key_value_heads,
        args.head_dim,
        dtype,
        device,
    )
    aux_layers = list(range(args.num_hidden_layers - 1))
    results = []
    for plan in (STEP1, STEP2):
        batch, spans = sc.step(plan, device)
        batch.validate(block_size)
        out = model(batch, cache, aux_hidden_layers=aux_layers)
        logits = model.compute_logits(out.hidden_states).cpu()
        results.append((spans, logits, _to_cpu(out)))
    refs = {n: hf_reference(hf, r.tokens) for n, r in sc.reqs.items()}
    return {"results": results, "refs": refs, "model": model, "hf": hf, "args": args}


def _compare(run: dict[str, Any], atol: float, check_hidden: bool) -> float:
    worst = 0.0
    for spans, logits, out in run["results"]:
        row = 0
        for name, start, end in spans:
            ref_logits, ref_hidden = run["refs"][name]
            got = logits[row : row + end - start]
            diff = (got - ref_logits[start:end]).abs().max().item()
            worst = max(worst, diff)
            assert diff < atol, f"request {name} rows {start}:{end}: logits differ by {diff}"
            if check_hidden:
                for layer, aux in zip(range(len(out.aux_hidden_states)), out.aux_hidden_states):
                    want = ref_hidden[layer + 1][start:end]
                    d = (aux[row : row + end - start].float() - want).abs().max().item()
                    assert d < atol, f"request {name}: aux hidden of layer {layer} differs by {d}"
                final = out.hidden_states[row : row + end - start].float()
                d = (final - ref_hidden[-1][start:end]).abs().max().item()
                assert d < atol, f"request {name}: final hidden state differs by {d}"
            row += end - start
    return worst


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fp32_logits_and_hidden_match_transformers(name: str, block_size: int) -> None:
    run = run_scenario(name, torch.float32, block_size)
    _compare(run, atol=1e-4, check_hidden=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cuda_matches_transformers(name: str, dtype: torch.dtype) -> None:
    """The same mixed batches on a GPU (default linear kernels there: the torch reference)."""
    run = run_scenario(name, dtype, 16, device="cuda")
    scale = max(ref[0].abs().max().item() for ref in run["refs"].values())
    # TF32 or bf16 matmuls on the GPU: compare loosely, like the CPU bf16 test.
    atol = 2e-3 * scale if dtype == torch.float32 else 0.05 * scale
    _compare(run, atol=atol, check_hidden=dtype == torch.float32)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_bf16_is_close_to_transformers_fp32(name: str) -> None:
    """Within 5 % of the logit scale, or within transformers' own bf16 error where that is larger (Gemma 3's
    norms after each block amplify bf16 rounding: 7 % in transformers on the tiny random model)."""
    run = run_scenario(name, torch.bfloat16, 4)
    scale = max(ref[0].abs().max().item() for ref in run["refs"].values())
    hf_bf16 = build_hf(name).to(torch.bfloat16)
    own = max(
        (hf_reference(hf_bf16, r.tokens)[0] - run["refs"][n][0]).abs().max().item()
        for n, r in Scenario(LENGTHS, 4).reqs.items()
    )
    bound = max(0.05 * scale, own)
    worst = _compare(run, atol=bound, check_hidden=False)
    assert worst < bound


@pytest.mark.parametrize("linear_kernels", sorted(LINEAR_KERNELS))
@pytest.mark.parametrize("name", ["llama3-rope-untied", "qwen2-bias"])
def test_pure_decode_batch_matches(name: str, linear_kernels: str) -> None:
    """Decodes only (the attention fast path; the small-row matmul formulations), twice in a row."""
    block_size = 4
    hf = build_hf(name)
    args = args_from_hf(hf.config)
    model = CausalLM.from_tensors(args, hf.state_dict(), linear_kernels=linear_kernels)
    sc = Scenario({"P": 9, "Q": 14, "R": 4}, block_size)
    cache = KVCache.allocate(
        args.num_hidden_layers,
        sc.num_blocks,
        block_size,
        args.num_key_value_heads,
        args.head_dim,
        torch.float32,
        "cpu",
    )
    model(sc.step([("P", 7), ("Q", 12), ("R", 2)])[0], cache)
    for plan in ([("P", 1), ("Q", 1), ("R", 1)], [("Q", 1)], [("P", 1), ("R", 1)]):
        batch, spans = sc.step(plan)
        logits = model.compute_logits(model(batch, cache).hidden_states)
        for row, (n, start, _) in enumerate(spans):
            ref = hf_reference(hf, sc.reqs[n].tokens)[0][start]
            assert (logits[row] - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 16, 32, 33, 70])
def test_linear_kernels_agree_with_reference(rows: int, dtype: torch.dtype) -> None:
    """Every registered matmul formulation computes the reference product (and fused residual add).
    The weight is a frozen parameter, as in the model, so ``onednn`` takes its packed path."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 48, generator=gen).to(dtype)
    w = torch.nn.Parameter(torch.randn(80, 48, generator=gen).to(dtype), requires_grad=False)
    bias = torch.randn(80, generator=gen).to(dtype)
    residual = torch.randn(rows, 80, generator=gen).to(dtype)
    ref = LINEAR_KERNELS["torch"]()
    tol = 1e-5 if dtype == torch.float32 else 0.1
    for name, factory in LINEAR_KERNELS.items():
        k = factory()
        for got, want in (
            (k.linear(x, w), ref.linear(x, w)),
            (k.linear(x, w, bias), ref.linear(x, w, bias)),
            (k.linear_add(residual, x, w), ref.linear_add(residual, x, w)),
        ):
            assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
            diff = (got.float() - want.float()).abs().max().item()
            assert diff < tol, f"{name} linear kernels differ from torch by {diff} at {rows} rows"


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")
def test_onednn_packs_frozen_weights_once_and_repacks_after_an_update() -> None:
    k = create_linear_kernels("onednn")
    w = torch.nn.Parameter(torch.randn(40, 24), requires_grad=False)
    x = torch.randn(4, 24)
    first = k.linear(x, w)
    assert len(k.packed) == 1
    k.linear(x, w)
    assert len(k.packed) == 1  # cached, not packed again
    with torch.no_grad():
        w.mul_(2.0)  # an in-place update must not leave a stale packed copy
    assert torch.allclose(k.linear(x, w), 2.0 * first, atol=1e-5)
    # Trainable or temporary weights are never packed (their values change between calls).
    trainable = torch.nn.Parameter(torch.randn(40, 24))
    k.linear(x, trainable)
    k.linear(x, torch.randn(40, 24))
    assert len(k.packed) == 1


def test_tied_lm_head_is_the_embedding_parameter() -> None:
    tied_hf = build_hf("llama-tied")
    tied = CausalLM.from_tensors(args_from_hf(tied_hf.config), tied_hf.state_dict())
    assert tied.lm_head is tied.embed_tokens
    untied_hf = build_hf("qwen3-qknorm")
    untied = CausalLM.from_tensors(args_from_hf(untied_hf.config), untied_hf.state_dict())
    assert untied.lm_head is not untied.embed_tokens
    assert untied.num_layers == 3 and untied.dtype == torch.float32


def test_bad_checkpoints_name_the_tensor() -> None:
    hf = build_hf("qwen2-bias")
    args = args_from_hf(hf.config)
    tensors = dict(hf.state_dict())
    missing = {k: v for k, v in tensors.items() if k != "model.layers.1.self_attn.k_proj.bias"}
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        CausalLM.from_tensors(args, missing)
    bad = dict(tensors)
    bad["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight.*shape"):
        CausalLM.from_tensors(args, bad)
    extra = dict(tensors)
    extra["model.layers.0.mlp.extra.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        CausalLM.from_tensors(args, extra)


def test_forward_rejects_bad_inputs_by_name() -> None:
    hf = build_hf("llama-tied")
    args = args_from_hf(hf.config)
    model = CausalLM.from_tensors(args, hf.state_dict())
    batch = build_forward_batch([PagedRequest([1, 2, 3], 0, [0])], 4)
    cache = KVCache.allocate(3, 4, 4, args.num_key_value_heads, args.head_dim, torch.float32, "cpu")
    with pytest.raises(ValueError, match="aux_hidden_layers index 3"):
        model(batch, cache, aux_hidden_layers=[3])
    with pytest.raises(ValueError, match="kv_cache has 2 K"):
        model(batch, KVCache(cache.k[:2], cache.v[:2]))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(build_forward_batch([PagedRequest([1], 200, list(range(51)))], 4), cache)
