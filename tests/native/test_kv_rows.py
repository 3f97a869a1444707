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
    bound = kernel.bind(caches)  # the same checks bound to the tensors
    with pytest.raises(ValueError, match="outside 0 .. 19"):
        bound(torch.tensor([1, 20]), torch.tensor([2, 3]))
    with pytest.raises(ValueError, match="outside 0 .. 19"):  # key 99's block past the table: its last column
        bound.move_branches(torch.tensor([[0, 9]]), torch.tensor([0]), torch.tensor([4]), torch.tensor([[95]]))
    with pytest.raises(ValueError, match="contiguous CPU tensors"):
        kernel.bind([caches[0], caches[1].transpose(0, 1)])
    for a, b in zip(caches, before):
        assert torch.equal(a, b)


@needs_cc
@pytest.mark.parametrize("isa", native.runnable_isas())
def test_branch_moves_equal_the_torch_path(isa: str) -> None:
    """``KVCache.move_branches``: the one native call (slots through the block tables, then the move) against
    its torch path, for branches off the first child, past the accepted count (-1), across a block boundary
    and through permuted block tables."""
    lib = native.load("kv_rows", isa)
    assert lib is not None
    tables = torch.tensor([[3, 1, 4, 0], [2, 0, 1, 3], [4, 2, 0, 1]])  # 5 blocks of 4 slots
    rows = torch.tensor([2, 0])  # the requests' rows of the tables
    root = torch.tensor([2, 6])  # their roots' keys
    nodes = torch.tensor([[2, 5, -1], [1, 3, 6]])  # accepted node numbers, -1 padded
    mine, ref = (KVCache(k=_caches(torch.float32, 2), v=_caches(torch.float32, 2)) for _ in range(2))
    mine.__dict__["_rows_kernel"] = KVRowsKernel(lib).bind(mine._distinct_tensors)
    ref.__dict__["_rows_kernel"] = None  # the torch path
    mine.move_branches(tables, rows, root, nodes)
    ref.move_branches(tables, rows, root, nodes)
    before = KVCache(k=_caches(torch.float32, 2), v=_caches(torch.float32, 2))
    for a, b, c in zip(mine.k + mine.v, ref.k + ref.v, before.k + before.v):
        assert torch.equal(a, b)
        flat, orig = a.view(-1, 3, 8), c.view(-1, 3, 8)
        # request 0 (row 2 of the tables: blocks 4, 2, ...): key 3 (slot 4 * 4 + 3) takes key 4 (slot 2 * 4 + 0),
        # key 4 takes key 7 (slot 2 * 4 + 3), key 5 stays; request 1: key 9 (block 4) takes key 12 (block 0)
        assert torch.equal(flat[19], orig[8]) and torch.equal(flat[8], orig[11]) and torch.equal(flat[9], orig[9])
        assert torch.equal(flat[17], orig[0])
        assert not torch.equal(a, c)
