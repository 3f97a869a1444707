"""Tree steps through the model (ForwardBatch.tree_masks): every attention path — the naive reference, SDPA,
the native paged kernel and the native decoder stack — gives each tree node the logits of its own path
computed from scratch, and the accepted branch's K/V rows, moved into the sequence's positions, equal those of
a from-scratch forward of the accepted sequence."""

from __future__ import annotations

import shutil

import pytest
import torch

from tandem import native
from tandem.model import CausalLM, KVCache
from tandem.model.forward_batch import ForwardBatch
from tandem.model.paged_batch import PagedRequest, build_forward_batch, tree_bits
from tests.model.test_transformer_vs_hf import args_from_hf, build_hf

pytestmark = pytest.mark.skipif(native._compiler() is None and shutil.which("gcc") is None, reason="no C compiler")

BLOCK = 4
CONTEXT = [3, 14, 15, 92, 65, 35, 89, 79, 32]  # 9 tokens: the last one is the tree's root
# root -> 1, 2;  2 -> 3, 4;  4 -> 5, 6  (node j = row j): 7 rows, with a decode beside them the 8 a dense
# model's native stack takes
PARENTS = [0, 0, 2, 2, 4, 4]
NODES = [11, 22, 33, 44, 55, 66]


def _model(backend: str, native_decode: bool = False) -> CausalLM:
    hf = build_hf("llama-tied")
    return CausalLM.from_tensors(args_from_hf(hf.config), hf.state_dict(), attn_backend=backend,
                                 native_decode=native_decode)


def _cache(model: CausalLM, blocks: int = 16) -> KVCache:
    a = model.args
    return KVCache.allocate(a.num_hidden_layers, blocks, BLOCK, a.num_key_value_heads, a.head_dim, torch.float32, "cpu")


def _path(node: int) -> list[int]:
    """Rows from the root's child down to ``node`` (node indices, root excluded)."""
    out = []
    while node:
        out.append(node)
        node = PARENTS[node - 1]
    return out[::-1]


def _from_scratch(model: CausalLM, tokens: list[int]) -> tuple[torch.Tensor, KVCache]:
    """Last-row logits of a causal forward of ``tokens`` into a fresh cache, and the cache."""
    cache = _cache(model)
    batch = build_forward_batch([PagedRequest(tokens, 0, list(range(16)))], BLOCK)
    hidden = model(batch, cache).hidden_states
    return model.compute_logits(hidden[-1:])[0], cache


def _tree_step(model: CausalLM, extra_decode: bool) -> tuple[torch.Tensor, KVCache, list[int], ForwardBatch]:
    """Prefill the context but its root, then one step: the tree (root + nodes), and optionally a plain
    decode of another request beside it. Returns the tree rows' logits, the cache and the tree's blocks."""
    cache = _cache(model, 32)
    blocks = list(range(8))
    other = list(range(8, 16))
    first = [PagedRequest(CONTEXT[:-1], 0, blocks)]
    if extra_decode:
        first.append(PagedRequest(CONTEXT[:5], 0, other))
    model(build_forward_batch(first, BLOCK), cache)
    reqs = [PagedRequest([CONTEXT[-1], *NODES], len(CONTEXT) - 1, blocks, parents=PARENTS)]
    if extra_decode:
        reqs.append(PagedRequest([CONTEXT[5]], 5, other))
    batch = build_forward_batch(reqs, BLOCK)
    batch.validate(BLOCK)
    hidden = model(batch, cache).hidden_states
    return model.compute_logits(hidden[: len(NODES) + 1]), cache, blocks, batch


@pytest.mark.parametrize("backend,native_decode", [("naive", False), ("sdpa", False), ("paged_cpu", False),
                                                   ("paged_cpu", True)])
@pytest.mark.parametrize("extra_decode", [False, True])
def test_each_node_gets_its_own_paths_logits(backend: str, native_decode: bool, extra_decode: bool) -> None:
    model = _model(backend, native_decode)
    logits, _, _, batch = _tree_step(model, extra_decode)
    nd = model._native_decode()
    assert (nd is not None and nd.applies(batch)) == native_decode, "the native stack must run exactly when asked"
    for node in range(len(NODES) + 1):
        want, _ = _from_scratch(model, CONTEXT + [NODES[j - 1] for j in _path(node)])
        torch.testing.assert_close(logits[node], want, rtol=0, atol=1e-4)


def test_a_wide_tree_takes_the_long_query_path() -> None:
    """More rows than a short query holds: SDPA's per-request path with the tree mask."""
    model = _model("paged_cpu")
    parents = [0] * 24 + list(range(1, 17))  # 24 children of the root, one child under each of the first 16
    nodes = list(range(100, 140))
    cache = _cache(model, 32)
    blocks = list(range(16))
    model(build_forward_batch([PagedRequest(CONTEXT[:-1], 0, blocks)], BLOCK), cache)
    batch = build_forward_batch([PagedRequest([CONTEXT[-1], *nodes], len(CONTEXT) - 1, blocks, parents=parents)], BLOCK)
    logits = model.compute_logits(model(batch, cache).hidden_states)
    assert batch.attn_metadata.long_queries, "a 41-row tree must take the long-query path"
    bits = tree_bits(parents)
    for node in (0, 5, 24, 25, 40):
        path = [r for r in range(1, node + 1) if bits[node] >> (node - r) & 1]  # bit b: the key b before its own
        want, _ = _from_scratch(model, CONTEXT + [nodes[j - 1] for j in path])
        torch.testing.assert_close(logits[node], want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("backend,native_decode", [("sdpa", False), ("paged_cpu", True)])
def test_the_accepted_branch_moved_into_place_equals_a_recomputation(backend: str, native_decode: bool) -> None:
    """Accepted branch root -> 2 -> 4 -> 6: not the first child at any depth. Its rows (slots of rows 2, 4, 6)
    move to the positions after the root; every layer's K/V there then equals a from-scratch forward's."""
    model = _model(backend, native_decode)
    _, cache, blocks, _ = _tree_step(model, extra_decode=False)
    accepted = _path(6)
    assert accepted == [2, 4, 6]
    root = len(CONTEXT) - 1

    def slot(i: int) -> int:
        return blocks[i // BLOCK] * BLOCK + i % BLOCK

    cache.move_rows(torch.tensor([slot(root + n) for n in accepted]),
                    torch.tensor([slot(root + 1 + d) for d in range(len(accepted))]))
    _, ref = _from_scratch(model, CONTEXT + [NODES[n - 1] for n in accepted])
    length = len(CONTEXT) + len(accepted)
    for mine, theirs in zip((*cache.k, *cache.v), (*ref.k, *ref.v)):
        got = mine.view(-1, *mine.shape[2:])[[slot(i) for i in range(length)]]
        want = theirs.view(-1, *theirs.shape[2:])[:length]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_bad_tree_masks_are_refused() -> None:
    with pytest.raises(ValueError, match="parent"):
        tree_bits([0, 2])
    batch = build_forward_batch([PagedRequest([1, 2, 3], 2, [0, 1], parents=[0, 0])], BLOCK)
    batch.tree_masks = torch.tensor([1, 3, 6])  # row 2 without the root
    with pytest.raises(ValueError, match="tree mask"):
        batch.validate(BLOCK)


@pytest.mark.parametrize("backend", ["naive", "sdpa", "paged_cpu"])
def test_sliding_windows_refuse_tree_steps(backend: str) -> None:
    from tandem.model.attention import create_attention_backend

    batch = build_forward_batch([PagedRequest([1, 2, 3], 2, [0, 1], parents=[0, 0])], BLOCK)
    with pytest.raises(ValueError, match="sliding-window"):
        create_attention_backend(backend, torch.float32).build_metadata(batch, BLOCK, window=8)
