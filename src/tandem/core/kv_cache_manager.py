"""Per-request view of the block pool: prefix-cache lookup, slot allocation, caching, freeing. Pure Python.

The only writer of ``Request.block_ids``. Prefix caching follows docs/SEMANTICS.md §2: a block is hashed from
known tokens only (prompt + committed outputs; never drafts or placeholders) and enters the cache only
when it is full and wholly before the request's *completed* frontier — every token in it computed by a
step whose output came back, and confirmed.
"""

from __future__ import annotations

from tandem.core.block_pool import BlockPool, KVBlock, hash_block_tokens
from tandem.core.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self._blocks: dict[str, list[KVBlock]] = {}
        self._num_cached: dict[str, int] = {}  # how many leading blocks of a request are in the cache

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- hashing -----------------------------------------------------------------------------------------
    def update_block_hashes(self, req: Request) -> None:
        """Extend ``req.block_hashes`` over every full block of known tokens."""
        bs = self.block_size
        n_full = req.num_tokens // bs
        while len(req.block_hashes) < n_full:
            i = len(req.block_hashes)
            parent = req.block_hashes[-1] if req.block_hashes else None
            tokens = [req.token_at(j) for j in range(i * bs, (i + 1) * bs)]
            req.block_hashes.append(hash_block_tokens(parent, tokens))

    def _block_tokens(self, req: Request, i: int) -> list[int]:
        bs = self.block_size
        return [req.token_at(j) for j in range(i * bs, (i + 1) * bs)]

    # -- lookup ------------------------------------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of full blocks; at least the last known token is always recomputed. Counts
        nothing (:meth:`record_query` does, at admission)."""
        if not self.enable_prefix_caching or req.num_computed_tokens:
            return [], 0
        self.update_block_hashes(req)
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        parent: int | None = None
        for i in range(min(max_blocks, len(req.block_hashes))):
            block = self.pool.lookup(req.block_hashes[i], parent, self._block_tokens(req, i))
            if block is None:
                break
            hits.append(block)
            parent = req.block_hashes[i]
        return hits, len(hits) * self.block_size

    def record_query(self, req: Request, num_hit_tokens: int) -> None:
        """Count one admitted request in the prefix-cache counters: its tokens looked up and those served.
        The scheduler calls it once per request, at its first admission; a head of the queue that waits
        for blocks is looked up again every step and must not be counted again."""
        stats = self.pool.stats
        stats.requests += 1
        stats.queries += req.num_tokens
        stats.hits += num_hit_tokens

    # -- allocation --------------------------------------------------------------------------------------
    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVBlock] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> bool:
        """Make room for ``num_new_tokens`` beyond the request's computed tokens (after the hits),
        plus ``num_lookahead_tokens`` a drafter will write past them (never beyond max_model_len).

        Returns False, changing nothing, when the pool cannot supply the blocks.
        """
        hits = new_computed_blocks or []
        held = self._blocks.get(req.request_id, [])
        total = req.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        if num_lookahead_tokens:
            total += num_lookahead_tokens
            if req.max_model_len is not None:
                total = min(total, max(req.max_model_len, req.num_computed_tokens + num_new_tokens))
        need = self.blocks_needed(total) - len(held) - len(hits)
        # Hit blocks that sit unused in the free queue leave it when we take them.
        revived = sum(1 for b in hits if b.ref_cnt == 0)
        if max(need, 0) + revived > self.pool.num_free_blocks:
            return False
        if hits:
            self.pool.touch(hits)
            held.extend(hits)
            self._num_cached[req.request_id] = len(held)
        if need > 0:
            held.extend(self.pool.allocate(need))
        self._blocks[req.request_id] = held
        req.block_ids = [b.block_id for b in held]
        return True

    def cache_blocks(self, req: Request, num_completed_tokens: int) -> None:
        """Enter the request's full blocks wholly before ``num_completed_tokens`` into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        held = self._blocks.get(req.request_id)
        if not held:
            return
        upto = min(num_completed_tokens, req.num_tokens) // self.block_size
        upto = min(upto, len(held))
        start = self._num_cached.get(req.request_id, 0)
        if upto <= start:
            return
        self.update_block_hashes(req)
        for i in range(start, upto):
            parent = req.block_hashes[i - 1] if i else None
            self.pool.cache(held[i], req.block_hashes[i], parent, self._block_tokens(req, i))
        self._num_cached[req.request_id] = upto

    def free(self, req: Request) -> None:
        held = self._blocks.pop(req.request_id, [])
        self._num_cached.pop(req.request_id, None)
        self.pool.free(list(reversed(held)))
        req.block_ids = []

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    # -- invariants --------------------------------------------------------------------------------------
    def check_invariants(self, live: dict[str, Request]) -> None:
        self.pool.check_invariants()
        refs: dict[int, int] = {}
        for req_id, blocks in self._blocks.items():
            req = live.get(req_id)
            if req is None:
                raise AssertionError(f"blocks held for unknown request {req_id}")
            if req.block_ids != [b.block_id for b in blocks]:
                raise AssertionError(f"request {req_id}: block_ids out of sync with the manager")
            for b in blocks:
                refs[b.block_id] = refs.get(b.block_id, 0) + 1
        for block in self.pool.blocks:
            if block.ref_cnt != refs.get(block.block_id, 0):
                raise AssertionError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but held "
                    f"{refs.get(block.block_id, 0)} times"
                )

    def all_free(self) -> bool:
        return not self._blocks and self.pool.num_free_blocks == self.pool.num_blocks
