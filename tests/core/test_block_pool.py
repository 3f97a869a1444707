"""The block pool's invariant check walks only the blocks ever allocated (``BlockPool.fresh``): fresh blocks
leave the free queue in id order before any freed one, and every corruption the full walk caught is still
caught — a referenced block in the free queue, a free block missing from it, a never-allocated block taken
or referenced through the pool, a stale cache index. (Reference counts change only through the pool's methods,
and a never-allocated block reaches none but ``allocate``: a cache hit's block was allocated when it was filled,
and freeing an unreferenced block raises.)"""

from __future__ import annotations

import pytest

from tandem.core.block_pool import BlockPool


def test_fresh_blocks_leave_in_id_order_before_freed_ones() -> None:
    pool = BlockPool(10)
    a = pool.allocate(3)
    assert [b.block_id for b in a] == [0, 1, 2] and pool.fresh == 3
    pool.free(a[::-1])
    b = pool.allocate(4)  # the rest of the fresh ids first, then the freed ones in eviction order
    assert [x.block_id for x in b] == [3, 4, 5, 6] and pool.fresh == 7
    c = pool.allocate(5)
    assert [x.block_id for x in c] == [7, 8, 9, 2, 1] and pool.fresh == 10
    pool.check_invariants()
    assert [x.block_id for x in pool.allocated_ever()] == list(range(10))


def test_a_large_pool_checks_only_what_it_used() -> None:
    pool = BlockPool(500_000)
    held = pool.allocate(5)
    pool.cache(held[0], 123, None, [1, 2, 3, 4])
    pool.free(held[::-1])
    pool.touch([pool.lookup(123, None, [1, 2, 3, 4])])  # type: ignore[list-item]
    assert pool.fresh == 5 and pool.num_free_blocks == 499_999
    pool.check_invariants()


def _broken(pool: BlockPool, what: str) -> None:
    if what == "referenced_block_in_free_queue":
        pool.blocks[1].ref_cnt = 1
        pool.free([pool.blocks[1]])  # ref 0 -> queue, then a reference taken behind the pool's back
        pool.blocks[1].ref_cnt = 1
    elif what == "free_block_missing_from_queue":
        del pool._free[1]  # noqa: SLF001
    elif what == "never_allocated_block_touched":
        pool.touch([pool.blocks[7]])  # a reference through the pool on a block it never handed out
    elif what == "never_allocated_block_taken_from_queue":
        del pool._free[8]  # noqa: SLF001
    elif what == "stale_cache_index":
        pool.cache(pool.blocks[0], 5, None, [1])
        pool.blocks[0].block_hash = 6


@pytest.mark.parametrize("what", [
    "referenced_block_in_free_queue", "free_block_missing_from_queue", "never_allocated_block_touched",
    "never_allocated_block_taken_from_queue", "stale_cache_index",
])  # fmt: skip
def test_every_corruption_is_still_caught(what: str) -> None:
    pool = BlockPool(10)
    held = pool.allocate(3)
    pool.free([held[1]])
    pool.check_invariants()
    _broken(pool, what)
    with pytest.raises(AssertionError):
        pool.check_invariants()


def test_a_never_allocated_block_cannot_be_freed() -> None:
    pool = BlockPool(10)
    pool.allocate(2)
    with pytest.raises(RuntimeError, match="double free of block 5"):
        pool.free([pool.blocks[5]])
