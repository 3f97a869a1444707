"""Tiny random checkpoints with awkward shapes for tensor-parallel tests (no transformers needed)."""

from __future__ import annotations

import random
from typing import Any

import torch

from tandem.model import ModelArgs
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.model.weights import expected_shapes


def tiny_args(**overrides: Any) -> ModelArgs:
    kw: dict[str, Any] = dict(
        family="llama", vocab_size=301, hidden_size=48, intermediate_size=97, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=3, head_dim=16, max_position_embeddings=128,
        tie_word_embeddings=True, rms_norm_eps=1e-6,
    )
    kw.update(overrides)
    return ModelArgs(**kw)


def random_tensors(args: ModelArgs, seed: int = 0, o_bias: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    shapes = dict(expected_shapes(args))
    if o_bias:
        for i in range(args.num_hidden_layers):
            shapes[f"model.layers.{i}.self_attn.o_proj.bias"] = (args.hidden_size,)
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.2 * torch.randn(shape, generator=gen)
        elif name.endswith("bias"):
            t = 0.2 * torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) * shape[-1] ** -0.5
        out[name] = t
    return out


# name -> (ModelArgs overrides, o_proj bias)
CONFIGS: dict[str, tuple[dict[str, Any], bool]] = {
    # 3 KV groups of 2 query heads: uneven over 2 ranks (2 groups / 1 group), one each over 3.
    "llama-uneven-groups": ({}, False),
    # Qwen2: q/k/v bias, and an o_proj bias that only rank 0 may add.
    "qwen2-bias": ({"family": "qwen2", "attention_bias": True}, True),
    # Qwen3: per-head q/k norm, untied LM head.
    "qwen3-qknorm-untied": ({"family": "qwen3", "qk_norm": True, "tie_word_embeddings": False}, False),
    # One KV head for 4 query heads: replicated on every rank, query heads split.
    "llama-replicated-kv": ({"num_attention_heads": 4, "num_key_value_heads": 1}, False),
}


def scenario_batches(args: ModelArgs, block_size: int = 4, seed: int = 3) -> tuple[list[Any], int]:
    """Two steps over scattered blocks: prefills, then decodes, a verify-sized query and a new prompt."""
    rng = random.Random(seed)
    lengths = {"a": 13, "b": 7, "c": 1, "d": 22}
    pool = list(range(40))
    rng.shuffle(pool)
    blocks, toks = {}, {}
    for name, n in lengths.items():
        nb = -(-(n + 4) // block_size)
        blocks[name], pool = pool[:nb], pool[nb:]
        toks[name] = [rng.randrange(args.vocab_size) for _ in range(n + 4)]
    step1 = [("a", 0, 13), ("b", 0, 7), ("d", 0, 18)]
    step2 = [("a", 13, 14), ("c", 0, 1), ("b", 7, 11), ("d", 18, 22)]
    batches = []
    for plan in (step1, step2):
        reqs = [PagedRequest(toks[n][s:e], s, blocks[n]) for n, s, e in plan]
        batches.append(build_forward_batch(reqs, block_size))
    return batches, 40
