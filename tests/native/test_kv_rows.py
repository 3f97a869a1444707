"""The native K/V row mover (``native/kv_rows.c``) against ``KVCache.move_rows``' torch loop: every ISA variant
this CPU runs, float32 and bf16, overlapping sources and destinations, shared tensors, bad slots refused."""

from __future__ import annotations

import shutil

import pytest
import torch

from tandem import native
from tandem.model.forward_batch import KVCache, move_rows_reference
from tandem.native.kv_rows import KVRowsKernel

needs_cc = pytest.mark.skipif(native._compiler() is None and shutil.which("gcc") is None, reason="no C compiler")


def _caches(dtype: torch.dtype, n: int = 6) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(5, 4, 3, 8, generator=gen).to(dtype) for _ in range(n)]


@needs_cc
@pytest.mark.parametrize("isa", native.runnable_isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pairs", [
    ([9, 11, 14], [8, 9, 10]),  # an accepted branch off the first child: sources overlap destinations
    ([3, 4, 5], [3, 4, 5]),  # the first children accepted: every row already in place
    ([17, 2], [2, 19]),  # a destination read as another pair's source
    ([], []),
])  # fmt: skip
def test_native_rows_equal_the_torch_loop(isa: str, dtype: torch.dtype, pairs: tuple[list[int], list[int]]) -> None:
    lib = native.load("kv_rows", isa)
    assert lib is not None
    kernel = KVRowsKernel(lib)
    src, dst = (torch.tensor(p, dtype=torch.int64) for p in pairs)
    mine, ref = _caches(dtype), _caches(dtype)
    kernel(mine, src, dst)
    move_rows_reference(ref, src, dst)
    for a, b in zip(mine, ref):
        assert torch.equal(a, b)
    if pairs[0] != pairs[1]:
        assert not torch.equal(mine[0], _caches(dtype)[0])  # something moved


@needs_cc
def test_the_kv_cache_moves_shared_tensors_once() -> None:
    """Layers of one KV cache group share a tensor: its rows move once, not once per layer (a second move of
    overlapping rows would move them again)."""
    cache = KVCache.allocate(4, 5, 4, 3, 8, torch.float32, "cpu", layer_tensor=[0, 1, 0, 1])
    gen = torch.Generator().manual_seed(2)
    for t in (*cache.k[:2], *cache.v[:2]):
        t.copy_(torch.randn(t.shape, generator=gen))
    assert cache._rows_kernel is not None
    ref = [t.clone() for t in cache._distinct_tensors]
    src, dst = torch.tensor([6, 7]), torch.tensor([5, 6])
    cache.move_rows(src, dst)
    move_rows_reference(ref, src, dst)
    assert len(cache._distinct_tensors) == 4
    for a, b in zip(cache._distinct_tensors, ref):
        assert torch.equal(a, b)


@needs_cc
def test_bad_slots_are_refused_and_nothing_is_written() -> None:
    kernel = KVRowsKernel(native.load("kv_rows"))
    caches = _caches(torch.float32, 2)
    before = [t.clone() for t in caches]
    with pytest.raises(ValueError, match="outside 0 .. 19"):
        kernel(caches, torch.tensor([1, 20]), torch.tensor([2, 3]))
    with pytest.raises(ValueError, match="must be"):
        kernel(caches, torch.tensor([1, 2]), torch.tensor([2]))
    with pytest.raises(ValueError, match="contiguous CPU tensors"):
        kernel([caches[0], caches[1].transpose(0, 1)], torch.tensor([1]), torch.tensor([2]))
    for a, b in zip(caches, before):
        assert torch.equal(a, b)
