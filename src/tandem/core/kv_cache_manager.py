"""Per-request view of the block pool: prefix-cache lookup, slot allocation, caching, freeing. Pure Python.

The only writer of ``Request.block_ids`` (and ``Request.group_block_ids``). Prefix caching follows
docs/SEMANTICS.md §2: a block is hashed from known tokens only (prompt + committed outputs; never drafts or
placeholders) and enters the cache only when it is full and wholly before the request's *completed* frontier —
every token in it computed by a step whose output came back, and confirmed.

KV cache groups (a model with sliding-window layers, Gemma 3): the layers are split into groups of equal size
(:func:`kv_cache_groups`) — the global layers, then the window layers in runs of that size — and a block id
names one page of *every* layer position of a group (the worker keeps one K and one V tensor per position,
shared by all groups). Each group has its own block table per request, all drawn from the one pool, so memory
is never split ahead of time. Group 0 is ``Request.block_ids``; groups 1.. are ``Request.group_block_ids``.
A window group lets go of the blocks every future query has slid past (all positions before
``first query - window + 1 - lookback``; ``lookback`` covers drafts a step may still roll back) once the steps
that wrote them came back: their table entries become the *null block* (block 0, held for ever, never read:
the window masks those positions), and the blocks enter the prefix cache, then go back to the pool, so a
prefix hit can revive them. A prefix hit of ``n`` blocks
needs group 0's first ``n`` blocks and each window group's blocks that the first recomputed position can see.
For a 4,096-token Gemma 3 request this holds 3 x 256 + 15 x ~33 layer pages instead of 18 x 256 (~27 %).
"""

from __future__ import annotations

from tandem.core.block_pool import BlockPool, KVBlock, hash_block_tokens
from tandem.core.request import Request


def kv_cache_groups(layer_windows: tuple[int, ...] | list[int], num_layers: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """``(window, layers)`` per KV cache group for a model whose layer ``i`` attends through
    ``layer_windows[i]`` (0 = globally; empty: every layer global). One group when every layer has the same
    window; else the global layers (group 0), then the window layers in runs of as many layers (the last run
    may be shorter). One window size per model."""
    windows = list(layer_windows) or [0] * num_layers
    if len(windows) != num_layers:
        raise ValueError(f"layer_windows has {len(windows)} entries for {num_layers} layers")
    if len(set(windows)) == 1:
        return ((windows[0], tuple(range(num_layers))),)
    sizes = {w for w in windows if w}
    if len(sizes) != 1:
        raise ValueError(f"one sliding-window size per model is supported, got {sorted(sizes)}")
    window = sizes.pop()
    full = tuple(i for i, w in enumerate(windows) if not w)
    local = [i for i, w in enumerate(windows) if w]
    return ((0, full), *((window, tuple(local[i : i + len(full)])) for i in range(0, len(local), len(full))))


def blocks_for_tokens(num_tokens: int, block_size: int, group_windows: tuple[int, ...], lookback: int = 0) -> int:
    """Blocks one request of ``num_tokens`` holds at most, over every group: a window group never more than
    its window's and the lookback's blocks plus the one being filled."""
    n = -(-num_tokens // block_size)
    per_window = {w: min(n, -(-(w + lookback) // block_size) + 1) for w in set(group_windows) if w}
    return sum(per_window[w] if w else n for w in group_windows)


def request_capacity(num_blocks: int, block_size: int, group_windows: tuple[int, ...], lookback: int = 0) -> int:
    """The longest request (tokens) ``num_blocks`` blocks can hold (the null block aside where a group has a
    window)."""
    usable = num_blocks - (1 if any(group_windows) else 0)
    lo, hi = 0, usable * block_size
    while lo < hi:  # the largest token count whose blocks fit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if blocks_for_tokens(mid, block_size, group_windows, lookback) <= usable else (lo, mid - 1)
    return lo


def layer_placement(groups: tuple[tuple[int, tuple[int, ...]], ...], num_layers: int) -> tuple[list[int], list[int]]:
    """(each layer's group, each layer's tensor: its position in its group) for :func:`kv_cache_groups`."""
    group_of, tensor_of = [0] * num_layers, [0] * num_layers
    for g, (_, layers) in enumerate(groups):
        for j, layer in enumerate(layers):
            group_of[layer], tensor_of[layer] = g, j
    return group_of, tensor_of


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        group_windows: tuple[int, ...] = (0,),
        lookback: int = 0,
    ) -> None:
        """``group_windows``: each KV cache group's window (0 = global), group 0 first; ``lookback``: positions
        before a window still kept (the drafts a step may roll back)."""
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if not group_windows or min(group_windows) < 0:
            raise ValueError(f"group_windows must name at least one group, windows >= 0: {group_windows}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.group_windows = tuple(group_windows)
        self.num_groups = len(self.group_windows)
        self.any_window = any(self.group_windows)  # some group releases blocks its window slid past
        self.lookback = lookback
        self.pool = BlockPool(num_blocks)
        # The null block fills the table entries of released blocks; it is held for ever, never read.
        self._null: KVBlock | None = self.pool.allocate(1)[0] if self.any_window else None
        self._blocks: dict[str, list[list[KVBlock]]] = {}  # per request, per group
        self._num_cached: dict[str, list[int]] = {}  # per request, per group: leading blocks walked by caching
        self._released: dict[str, list[int]] = {}  # per request, per group: leading blocks released
        # Per request, per group: block ids allocated since the scheduler last took them (take_new_blocks).
        self._new_ids: dict[str, list[list[int]]] = {}

    @property
    def num_blocks(self) -> int:
        """Blocks requests can hold (the null block aside)."""
        return self.pool.num_blocks - (self._null is not None)

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_for_request(self, num_tokens: int) -> int:
        """Blocks one request of ``num_tokens`` holds at most, over every group (:func:`blocks_for_tokens`)."""
        return blocks_for_tokens(num_tokens, self.block_size, self.group_windows, self.lookback)

    def check_fits(self, max_model_len: int) -> None:
        """A request of ``max_model_len`` tokens must fit in the whole cache, or it could never finish."""
        if self.blocks_for_request(max_model_len) > self.num_blocks:
            raise ValueError(
                f"max_model_len ({max_model_len}) is larger than the KV cache can hold ({self.num_blocks} blocks "
                f"of {self.block_size} tokens; a request of max_model_len tokens needs "
                f"{self.blocks_for_request(max_model_len)}): one request could never finish; lower "
                "max_model_len or raise kv_cache_memory / num_kv_blocks"
            )

    def check_prompt(self, num_prompt_tokens: int, max_model_len: int) -> None:
        """A prompt plus one output token must fit in the context and in the whole cache."""
        if num_prompt_tokens >= max_model_len:
            raise ValueError(
                f"prompt is {num_prompt_tokens} tokens; max_model_len is {max_model_len} "
                "(the prompt plus at least one output token must fit)"
            )
        need = self.blocks_for_request(num_prompt_tokens + 1)
        if need > self.num_blocks:
            raise ValueError(
                f"prompt of {num_prompt_tokens} tokens needs {need} KV blocks but the whole KV cache "
                f"has {self.num_blocks}; raise kv_cache_memory / num_kv_blocks"
            )

    def num_blocks_held(self, req: Request) -> int:
        """Pool blocks ``req`` holds over every group (null entries aside)."""
        held = self._blocks.get(req.request_id, [])
        return sum(1 for group in held for b in group if b is not self._null)

    # -- hashing -----------------------------------------------------------------------------------------
    def update_block_hashes(self, req: Request) -> None:
        """Extend ``req.block_hashes`` over every full block of known tokens."""
        bs = self.block_size
        n_full = req.num_tokens // bs
        while len(req.block_hashes) < n_full:
            i = len(req.block_hashes)
            parent = req.block_hashes[-1] if req.block_hashes else None
            req.block_hashes.append(hash_block_tokens(parent, req.tokens(i * bs, (i + 1) * bs)))

    def _block_tokens(self, req: Request, i: int) -> list[int]:
        return req.tokens(i * self.block_size, (i + 1) * self.block_size)

    @staticmethod
    def _group_hash(h: int | None, g: int) -> int | None:
        """Group ``g``'s key for a block of hash ``h`` (group 0: ``h`` itself): the same tokens in another
        group are other layers' KV."""
        return h if g == 0 or h is None else hash_block_tokens(h, [-g])

    def _lookup(self, req: Request, g: int, i: int) -> KVBlock | None:
        parent = req.block_hashes[i - 1] if i else None
        return self.pool.lookup(
            self._group_hash(req.block_hashes[i], g), self._group_hash(parent, g), self._block_tokens(req, i)
        )

    def _first_needed(self, g: int, first_query: int) -> int:
        """Group ``g``'s first block any query at or after ``first_query`` can read (0 for a global group)."""
        w = self.group_windows[g]
        return max(0, first_query - w + 1 - self.lookback) // self.block_size if w else 0

    # -- lookup ------------------------------------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> tuple[list[list[KVBlock]], int]:
        """Longest cached prefix of full blocks, per group (window groups: the null block before what the
        first recomputed position sees); at least the last known token is always recomputed. Counts
        nothing (:meth:`record_query` does, at admission)."""
        if not self.enable_prefix_caching or req.num_computed_tokens:
            return [], 0
        self.update_block_hashes(req)
        max_blocks = min((req.num_tokens - 1) // self.block_size, len(req.block_hashes))
        hits: list[KVBlock] = []
        if self.group_windows[0] == 0:
            for i in range(max_blocks):
                block = self._lookup(req, 0, i)
                if block is None:
                    break
                hits.append(block)
            n = len(hits)
        else:
            n = max_blocks
        while n > 0:  # the longest prefix every window group can serve too
            groups = [hits[:n]] if self.group_windows[0] == 0 else []
            for g in range(len(groups), self.num_groups):
                lo = self._first_needed(g, n * self.block_size)
                found = [self._lookup(req, g, i) for i in range(lo, n)]
                if any(b is None for b in found):
                    break
                groups.append([self._null] * lo + found)  # type: ignore[list-item]
            else:
                return groups, n * self.block_size
            n -= 1
        return [], 0

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
        new_computed_blocks: list[list[KVBlock]] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> bool:
        """Make room for ``num_new_tokens`` beyond the request's computed tokens (after the hits),
        plus ``num_lookahead_tokens`` a drafter will write past them (never beyond max_model_len); window
        groups let go of what every query from this step on has slid past.

        Returns False, changing nothing, when the pool cannot supply the blocks.
        """
        rid = req.request_id
        held = self._blocks.get(rid)
        hits = new_computed_blocks or [[] for _ in self.group_windows]
        held = held or [[] for _ in self.group_windows]
        released = self._released.get(rid) or [0] * self.num_groups
        first_query = req.num_computed_tokens + len(hits[0]) * self.block_size
        total = first_query + num_new_tokens
        if num_lookahead_tokens:
            total += num_lookahead_tokens
            if req.max_model_len is not None:
                total = min(total, max(req.max_model_len, req.num_computed_tokens + num_new_tokens))
        blocks = -(-total // self.block_size)
        need = [blocks - len(held[g]) - len(hits[g]) for g in range(self.num_groups)]
        # Window groups: held blocks every query from this step on has slid past go back to the pool — once
        # the steps that wrote them came back (wholly before the completed frontier), entering the prefix
        # cache first, so a later request can still be served them.
        drop: list[list[KVBlock]] = [[] for _ in held]
        if self.any_window:
            done = min(req.completed_frontier, req.num_tokens) // self.block_size
            drop = [
                held[g][released[g] : min(self._first_needed(g, first_query), len(held[g]), done)]
                for g in range(self.num_groups)
            ]
        freed = sum(1 for group in drop for b in group if b.ref_cnt == 1)
        # Hit blocks that sit unused in the free queue leave it when we take them.
        revived = sum(1 for group in hits for b in group if b.ref_cnt == 0)
        if sum(max(n, 0) for n in need) + revived > self.pool.num_free_blocks + freed:
            return False
        if any(drop):
            self.cache_blocks(req, req.completed_frontier)
        for g, group in enumerate(drop):
            if group:
                self.pool.free(list(reversed(group)))
                held[g][released[g] : released[g] + len(group)] = [self._null] * len(group)  # type: ignore[list-item]
                released[g] += len(group)
        if hits[0]:
            cached = []
            for g in range(self.num_groups):
                real = [b for b in hits[g] if b is not self._null]
                self.pool.touch(real)
                released[g] = max(released[g], len(hits[g]) - len(real))
                held[g].extend(hits[g])
                cached.append(len(held[g]))
            self._num_cached[rid] = cached
        for g in range(self.num_groups):
            if need[g] > 0:
                new = self.pool.allocate(need[g])
                held[g].extend(new)
                self._new_ids.setdefault(rid, [[] for _ in self.group_windows])[g].extend(b.block_id for b in new)
        self._blocks[rid] = held
        self._released[rid] = released
        req.block_ids = [b.block_id for b in held[0]]
        req.group_block_ids = [[b.block_id for b in group] for group in held[1:]]
        return True

    def allocate_chunk(
        self,
        req: Request,
        num_new_tokens: int,
        new_computed_blocks: list[list[KVBlock]] | None,
        num_lookahead_tokens: int,
        shrink: bool,
    ) -> int:
        """:meth:`allocate_slots` for a chunk of ``num_new_tokens``; with ``shrink``, halved (not below one
        block) until it fits — a prefill chunk needs every block of its window groups at once, so a smaller
        chunk fits where a whole prompt does not. Returns the tokens allocated for, 0 when nothing fits."""
        if new_computed_blocks is None and self.num_groups == 1 and (held := self._blocks.get(req.request_id)):
            # A running request of a model without window groups (nothing to release): most steps, its blocks
            # already cover the new tokens and nothing changes.
            total = req.num_computed_tokens + num_new_tokens
            if num_lookahead_tokens:
                total += num_lookahead_tokens
                if req.max_model_len is not None:
                    total = min(total, max(req.max_model_len, req.num_computed_tokens + num_new_tokens))
            if -(-total // self.block_size) <= len(held[0]):
                return num_new_tokens
        while not self.allocate_slots(req, num_new_tokens, new_computed_blocks, num_lookahead_tokens):
            if not shrink or num_new_tokens <= self.block_size:
                return 0
            num_new_tokens = max(self.block_size, num_new_tokens // 2)
        return num_new_tokens

    def cache_blocks(self, req: Request, num_completed_tokens: int) -> None:
        """Enter the request's full blocks wholly before ``num_completed_tokens`` into the prefix cache
        (every group's; released window blocks were cached before they slid out, or are lost)."""
        if not self.enable_prefix_caching:
            return
        upto = min(num_completed_tokens, len(req.prompt_token_ids) + len(req.output_token_ids)) // self.block_size
        starts = self._num_cached.get(req.request_id)
        if starts is not None and upto <= min(starts):
            return  # most steps: no block completed since the last call
        held = self._blocks.get(req.request_id)
        if not held:
            return
        starts = starts or [0] * self.num_groups
        if upto <= min(starts):
            return
        self.update_block_hashes(req)
        for g, group in enumerate(held):
            end = min(upto, len(group))
            for i in range(starts[g], end):
                if group[i] is self._null:
                    continue
                parent = req.block_hashes[i - 1] if i else None
                self.pool.cache(group[i], self._group_hash(req.block_hashes[i], g),
                                self._group_hash(parent, g), self._block_tokens(req, i))
            starts[g] = max(starts[g], end)
        self._num_cached[req.request_id] = starts

    def take_new_blocks(self) -> dict[str, list[list[int]]]:
        """Request id -> per group, the block ids allocated since the last call (what a running request's
        runner-side table still lacks); starts afresh."""
        new, self._new_ids = self._new_ids, {}
        return new

    def free(self, req: Request) -> None:
        held = self._blocks.pop(req.request_id, [])
        self._new_ids.pop(req.request_id, None)
        self._num_cached.pop(req.request_id, None)
        self._released.pop(req.request_id, None)
        for group in reversed(held):
            self.pool.free([b for b in reversed(group) if b is not self._null])
        req.block_ids = []
        req.group_block_ids = []

    def reset_prefix_cache(self) -> bool:
        if self._null is not None:
            self.pool.free([self._null])
        ok = self.pool.reset_prefix_cache()
        if self._null is not None:
            self.pool.touch([self._null])
        return ok

    # -- invariants --------------------------------------------------------------------------------------
    def check_invariants(self, live: dict[str, Request]) -> None:
        self.pool.check_invariants()
        refs: dict[int, int] = {} if self._null is None else {self._null.block_id: 1}
        for req_id, groups in self._blocks.items():
            req = live.get(req_id)
            if req is None:
                raise AssertionError(f"blocks held for unknown request {req_id}")
            if req.block_ids != [b.block_id for b in groups[0]] or req.group_block_ids != [
                [b.block_id for b in group] for group in groups[1:]
            ]:
                raise AssertionError(f"request {req_id}: block_ids out of sync with the manager")
            for group in groups:
                for b in group:
                    if b is not self._null:
                        refs[b.block_id] = refs.get(b.block_id, 0) + 1
        if any(bid >= self.pool.fresh for bid in refs):
            raise AssertionError("a request holds a block the pool never allocated")
        for block in self.pool.allocated_ever():  # the others are unreferenced (BlockPool.check_invariants)
            if block.ref_cnt != refs.get(block.block_id, 0):
                raise AssertionError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but held "
                    f"{refs.get(block.block_id, 0)} times"
                )

    def all_free(self) -> bool:
        return not self._blocks and self.pool.num_free_blocks == self.num_blocks
