"""Every registered attention backend against a dense per-request reference, on random tensors.

The reference knows nothing about pages: it keeps each request's keys and values as one contiguous
float64 tensor and applies the causal rule directly. The backends see the same data only through a cache
with shuffled block ids, after writing this step's K/V themselves.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from tandem.model.attention import (
    ATTENTION_BACKENDS,
    AttentionBackend,
    PagedCpuBackend,
    SdpaBackend,
    create_attention_backend,
)
from tandem.model.attention.base import SHORT_QUERY_MAX
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tandem.speculative_config import MAX_SPECULATIVE_TOKENS

# (cached tokens, query tokens) per request.
MIXED = [
    (3, 11),  # a chunk after context whose query spans several blocks
    (15, 1),  # a decode reaching seq_len 16, an exact multiple of the block size
    (0, 20),  # a fresh prefill
    (9, 4),  # a verify step: one token plus three drafts
    (0, 1),  # a one-token prompt
    (30, 1),  # a long decode
    (0, 5),  # a short fresh prefill
    (6, 1),
]
DECODES = [(15, 1), (3, 1), (40, 1), (7, 1)]
SAME_LENGTH_DECODES = [(12, 1), (12, 1), (12, 1)]
VERIFIES = [(5, 4), (12, 4), (3, 4)]

BACKENDS: dict[str, Callable[[torch.dtype], AttentionBackend]] = {
    **ATTENTION_BACKENDS,
    # The same SDPA kernel with every multi-token query sent down one path or the other.
    "sdpa-all-long": lambda dtype: SdpaBackend(dtype, short_query_max=1),
    "sdpa-all-grouped": lambda dtype: SdpaBackend(dtype, short_query_max=1000),
    # The native kernel for every query (prefill chunks too), and for none.
    "paged_cpu-all-short": lambda dtype: PagedCpuBackend(dtype, short_query_max=1000),
    "paged_cpu-all-long": lambda dtype: PagedCpuBackend(dtype, short_query_max=0),
}


def reference(
    queries: list[torch.Tensor],
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    scale: float,
    window: int = 0,
) -> list[torch.Tensor]:
    """Dense causal attention per request in float64; query j of a request sits at seq_len - q + j and,
    with a ``window``, sees only the last ``window`` positions up to itself."""
    outs = []
    for q, k, v in zip(queries, keys, values):
        q_len, heads, _ = q.shape
        seq_len, kv_heads, _ = k.shape
        out = torch.empty(q.shape, dtype=torch.float64)
        for j in range(q_len):
            visible = seq_len - q_len + j + 1
            first = max(0, visible - window) if window else 0
            for h in range(heads):
                kh = h // (heads // kv_heads)
                scores = (k[first:visible, kh].double() @ q[j, h].double()) * scale
                out[j, h] = torch.softmax(scores, 0) @ v[first:visible, kh].double()
        outs.append(out)
    return outs


def run_case(
    backend: AttentionBackend,
    layout: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
    head_dim: int = 16,
    window: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``backend`` on one random batch; returns (its output, the dense reference)."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    blocks_per_req = [-(-(c + q) // block_size) for c, q in layout]
    num_blocks = sum(blocks_per_req) + 3
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    paged, full_k, full_v, queries = [], [], [], []
    for (cached, q_len), nb in zip(layout, blocks_per_req):
        blocks, pool = pool[:nb], pool[nb:]
        paged.append(PagedRequest([0] * q_len, cached, blocks))
        # The context the cache already holds, read back position by position.
        slots = [blocks[p // block_size] * block_size + p % block_size for p in range(cached)]
        full_k.append(k_cache.view(-1, kv_heads, head_dim)[slots])
        full_v.append(v_cache.view(-1, kv_heads, head_dim)[slots])
    batch = build_forward_batch(paged, block_size)
    batch.validate(block_size)
    t = batch.num_tokens
    q = torch.randn(t, heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(t, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(t, kv_heads, head_dim, generator=gen).to(dtype)
    qsl = batch.query_start_loc
    for i in range(len(layout)):
        rows = slice(qsl[i], qsl[i + 1])
        queries.append(q[rows])
        full_k[i] = torch.cat([full_k[i], k[rows]])
        full_v[i] = torch.cat([full_v[i], v[rows]])
    scale = head_dim**-0.5
    metadata = backend.build_metadata(batch, block_size, window)
    out = backend.forward(q, k, v, k_cache, v_cache, metadata, scale)
    want = torch.cat(reference(queries, full_k, full_v, scale, window))
    written_k = k_cache.view(-1, kv_heads, head_dim)[batch.slot_mapping]
    written_v = v_cache.view(-1, kv_heads, head_dim)[batch.slot_mapping]
    assert torch.equal(written_k, k) and torch.equal(written_v, v), (
        "K/V not written at slot_mapping"
    )
    return out, want


LAYOUTS = {
    "mixed": MIXED,
    "decodes": DECODES,
    "same-length-decodes": SAME_LENGTH_DECODES,
    "verifies": VERIFIES,
    "single-prefill": [(0, 13)],
    "single-chunk": [(8, 9)],
    # a verify of one token plus suffix decoding's default 24 drafts, and one of the most drafts allowed (32)
    "deep-verifies": [(40, 25), (7, 33)],
}


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
def test_backend_matches_dense_reference(
    backend_name: str, layout: str, heads: int, kv_heads: int, block_size: int
) -> None:
    backend = BACKENDS[backend_name](torch.float32)
    out, want = run_case(backend, LAYOUTS[layout], heads, kv_heads, block_size, torch.float32)
    assert out.shape == want.shape
    diff = (out.double() - want).abs().max().item()
    assert diff < 1e-5, f"{backend_name} on {layout}: max abs diff {diff}"


@pytest.mark.parametrize("window", [1, 3, 6])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
def test_backend_sliding_window_matches_dense_reference(backend_name: str, layout: str, window: int) -> None:
    """A sliding window (Gemma 3's local layers): keys before each query's last ``window`` positions are
    hidden, in fresh prefills (shorter and longer than the window), chunks, verifies and decodes."""
    backend = BACKENDS[backend_name](torch.float32)
    out, want = run_case(backend, LAYOUTS[layout], 4, 1, 4, torch.float32, window=window)
    diff = (out.double() - want).abs().max().item()
    assert diff < 1e-5, f"{backend_name} on {layout}, window {window}: max abs diff {diff}"


@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
def test_backend_bf16_is_close(backend_name: str) -> None:
    backend = BACKENDS[backend_name](torch.bfloat16)
    out, want = run_case(backend, MIXED, 8, 2, 4, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert (out.double() - want).abs().max().item() < 3e-2


def test_registry_names_unknown_backend() -> None:
    with pytest.raises(ValueError, match="unknown attention backend 'flash9'"):
        create_attention_backend("flash9", torch.float32)
    assert {"paged_cpu", "sdpa", "naive"} <= set(ATTENTION_BACKENDS)


def test_sdpa_metadata_groups_decodes_into_one_call() -> None:
    paged = [PagedRequest([1], c, list(range(i * 4, i * 4 + 4))) for i, c in enumerate([3, 9, 14])]
    batch = build_forward_batch(paged, 4)
    meta = SdpaBackend().build_metadata(batch, 4)
    assert len(meta.groups) == 1 and not meta.long_queries and meta.single_group
    assert meta.groups[0].max_len == 15 and meta.groups[0].mask is not None


def test_every_verify_is_a_short_query() -> None:
    """A verify of one token plus as many drafts as speculative_config allows is a short query, which the CPU's
    native kernel (and decoder stack) take: at 17 a 24-draft verify left both (32 instead of 18 ms a step)."""
    assert SHORT_QUERY_MAX == 1 + MAX_SPECULATIVE_TOKENS
    for backend in (PagedCpuBackend(), SdpaBackend()):
        assert backend.short_query_max == SHORT_QUERY_MAX
    paged = [PagedRequest([0] * q, c, list(range(i * 8, i * 8 + 8))) for i, (c, q) in enumerate([(40, 33), (5, 34)])]
    meta = PagedCpuBackend().build_metadata(build_forward_batch(paged, 16), 16)
    assert [(lq.row_start, lq.row_end) for lq in meta.long_queries] == [(33, 67)]  # 33 queries short, 34 long
