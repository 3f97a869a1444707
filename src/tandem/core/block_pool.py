"""The physical KV block pool: allocation, reference counts, LRU free list, prefix-cache index. Pure Python.

A block is in exactly one of three states:
- in use: ref_cnt > 0 (held by one or more requests; shared prefix blocks have ref_cnt > 1);
- free and cached: ref_cnt == 0, still indexed by its hash, in the free queue (reusable by a cache hit,
  evictable by an allocation);
- free and empty: ref_cnt == 0, no hash, in the free queue.

Invariants (``check_invariants``):
- a block is in the free queue iff its ref_cnt is 0;
- every hashed block is in the cache index under its hash, and the index holds nothing else;
- num_free_blocks == len(free queue);
- blocks never allocated are the ids from ``fresh`` on, all at the free queue's head in id order: the queue
  starts as every id in order, frees append at its tail and allocation pops its head, so fresh blocks are
  handed out in id order before any freed one, and nothing but ``allocate`` hands out a block. So the check
  walks the ``fresh`` blocks ever allocated, not the whole pool (a tiny model's 1 GiB pool holds ~500,000
  blocks, and the debug mode checks twice a step), and counts the rest through the free queue's length.

Eviction order: the free queue is LRU — freed blocks go to the tail, allocation takes from the head and
drops the block's hash at that moment. Requests free their blocks tail first, so a request's last blocks
are evicted before its shared prefix.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field


def hash_block_tokens(parent_hash: int | None, token_ids: list[int] | tuple[int, ...]) -> int:
    """Chained hash of a full block: 128-bit blake2b over the parent's hash and this block's tokens."""
    h = hashlib.blake2b(digest_size=16)
    h.update((parent_hash or 0).to_bytes(16, "little"))
    h.update(array("q", token_ids).tobytes())
    return int.from_bytes(h.digest(), "little")


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    # The key the hash was built from, compared on a hit so a hash collision can never serve wrong KV.
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()


@dataclass
class PrefixCacheStats:
    queries: int = 0  # tokens looked up
    hits: int = 0  # tokens served from the cache
    requests: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass
class BlockPool:
    num_blocks: int
    blocks: list[KVBlock] = field(init=False)
    _free: OrderedDict[int, None] = field(init=False)  # block_id -> None, LRU order (head = oldest)
    _cached: dict[int, KVBlock] = field(init=False)  # block_hash -> block
    stats: PrefixCacheStats = field(init=False)

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {self.num_blocks}")
        self.blocks = [KVBlock(i) for i in range(self.num_blocks)]
        self._free = OrderedDict((i, None) for i in range(self.num_blocks))
        self._cached = {}
        self.stats = PrefixCacheStats()
        self.fresh = 0  # blocks [0, fresh) have been allocated at least once; the others never

    def allocated_ever(self) -> list[KVBlock]:
        """The blocks ever allocated (every other block is free, unhashed, never referenced)."""
        return self.blocks[: self.fresh]

    # -- queries -----------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (held by a request); free cached blocks count as free."""
        return 1.0 - len(self._free) / self.num_blocks

    def lookup(self, block_hash: int, parent_hash: int | None, token_ids: list[int]) -> KVBlock | None:
        block = self._cached.get(block_hash)
        if block is None or block.parent_hash != parent_hash or block.token_ids != tuple(token_ids):
            return None
        return block

    # -- allocation --------------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[KVBlock]:
        if n > len(self._free):
            raise RuntimeError(f"cannot allocate {n} blocks, {len(self._free)} free")
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            if block_id >= self.fresh:
                self.fresh = block_id + 1
            block = self.blocks[block_id]
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on cache-hit blocks (removing them from the free queue if unused)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop one reference on each block; the caller passes them in eviction order."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None

    # -- prefix cache ------------------------------------------------------------------------------------
    def cache(self, block: KVBlock, block_hash: int, parent_hash: int | None, tokens: list[int]) -> None:
        if block.block_hash is not None:
            return  # already cached (a shared prefix block, or cached at an earlier step)
        if block_hash in self._cached:
            return  # the same content lives in another block; keep the first one
        block.block_hash = block_hash
        block.parent_hash = parent_hash
        block.token_ids = tuple(tokens)
        self._cached[block_hash] = block

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None
            block.parent_hash = None
            block.token_ids = ()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; only allowed when no block is in use."""
        if len(self._free) != self.num_blocks:
            return False
        for block in self.blocks:
            self._evict(block)
        return True

    # -- invariants --------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        free_seen = 0
        for block in self.allocated_ever():
            in_free = block.block_id in self._free
            free_seen += in_free
            if (block.ref_cnt == 0) != in_free:
                raise AssertionError(f"block {block.block_id}: ref_cnt {block.ref_cnt}, in free={in_free}")
            if block.ref_cnt < 0:
                raise AssertionError(f"block {block.block_id}: negative ref_cnt")
            if block.block_hash is not None and self._cached.get(block.block_hash) is not block:
                raise AssertionError(f"block {block.block_id}: hashed but not indexed")
        if any(b.block_hash != h for h, b in self._cached.items()):
            raise AssertionError("cache index holds a block under a stale hash")
        # every never-allocated block is free: the queue holds the allocated free blocks and exactly as many others
        if len(self._free) != free_seen + self.num_blocks - self.fresh:
            raise AssertionError(f"free queue holds {len(self._free)} blocks, not {free_seen} allocated + "
                                 f"{self.num_blocks - self.fresh} never allocated")
        if self.fresh < self.num_blocks:
            nxt = self.blocks[self.fresh]  # the next fresh block: still pristine, and the queue's head
            if nxt.ref_cnt or nxt.block_hash is not None or next(iter(self._free)) != nxt.block_id:
                raise AssertionError(f"block {nxt.block_id}: never allocated, but not pristine at the queue's head")
