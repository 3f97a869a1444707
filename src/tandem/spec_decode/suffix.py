"""Suffix decoding (vLLM's ``method="suffix"``; Snowflake's SuffixDecoding): model-free drafts from the
request's own tokens (prompt + output) and from the outputs of recent requests.

The index is a suffix trie of bounded depth, stored flat: for every position of a sequence and every
context length n = 1 .. ``suffix_decoding_max_tree_depth``, the n tokens before the position (as a 61-bit
polynomial hash) map to counts of the token that followed. Each request has its own index over its prompt
and outputs, grown by the tokens each step commits; a global index holds the outputs of the last
``suffix_decoding_max_cached_requests`` requests that left (their contexts may reach into their prompts).

Drafting, per request: the longest context ending at the last token that either index has seen picks the
continuation counts (both indexes added, the request's own counted ``OWN_WEIGHT`` times); the most frequent
token is drafted, its frequency share multiplies a running score, and drafting goes on from the extended
context until ``k`` drafts, the request's limit, ``suffix_decoding_max_spec_factor`` x the first match's
length, or a score below ``suffix_decoding_min_token_prob``. Drafts are greedy and verified exactly (q
one-hot), so a hash collision can only cost acceptance, never correctness.

Host-side (behind ``OnHost``: it reads the committed tokens), so it works with async scheduling and, being
a deterministic function of what every rank sees, under tensor parallelism. Where native kernels are on
(``execution.native``) the index and the drafting loop run in C (native/suffix_index.c: the same drafts,
~10x less time — keeping the index current cost ~5 % of a step at 4 streams in Python, BENCHMARKS.md §19);
this module's ``SuffixIndex`` and ``draft`` are the reference. Memory per (token, context length) pair —
~24 pairs a token at depth 24 — for each live request's prompt and outputs and for the cached outputs (their
number bounded by ``suffix_decoding_max_cached_requests``): about 100 bytes in Python, ~30 in C.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from tandem.config import SpeculativeConfig
from tandem.native import suffix_index as native_index
from tandem.spec_decode.proposer import ProposeInput, Proposer
from tandem.worker.request_state import RequestState

_MOD = (1 << 61) - 1
_BASE = 1_000_003
_KEY = "suffix_index"  # RequestState.proposer_state: (its SuffixIndex, tokens indexed so far)
# A continuation in the request's own tokens counts this many times one in other requests' outputs: a request
# repeats itself more surely than it repeats others (at a context both have seen, e.g. after "```python\ndef",
# the summed counts let other requests' function names outvote the request's own, once each).
OWN_WEIGHT = 4


def _context_hashes(tokens: list[int], end: int, depth: int) -> list[int]:
    """Hashes of tokens[end - n : end] for n = 1 .. min(depth, end), shortest first."""
    out, h, power = [], 0, 1
    for i in range(end - 1, max(end - depth, 0) - 1, -1):
        h = (h + (tokens[i] + 1) * power) % _MOD
        power = power * _BASE % _MOD
        out.append(h)
    return out


class SuffixIndex:
    """Context hash -> {next token: count}; a context seen with one continuation holds a bare token id."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.table: dict[int, Any] = {}

    def add(self, tokens: list[int], start: int, sign: int = 1) -> None:
        """Count (or with ``sign=-1`` uncount) the tokens at positions ``start ..`` after each of their contexts."""
        table = self.table
        for p in range(max(start, 1), len(tokens)):
            nxt = tokens[p]
            for key in _context_hashes(tokens, p, self.depth):
                cur = table.get(key)
                if sign > 0:
                    if cur is None:
                        table[key] = nxt
                    elif isinstance(cur, int):
                        table[key] = {cur: 1, nxt: 1} if cur != nxt else {cur: 2}
                    else:
                        cur[nxt] = cur.get(nxt, 0) + 1
                elif isinstance(cur, int):
                    if cur == nxt:
                        del table[key]
                elif cur is not None and nxt in cur:
                    cur[nxt] -= 1
                    if cur[nxt] <= 0:
                        del cur[nxt]
                    if not cur:
                        del table[key]

    def counts(self, key: int) -> dict[int, int] | None:
        cur = self.table.get(key)
        return {cur: 1} if isinstance(cur, int) else cur

    def __len__(self) -> int:
        return len(self.table)


class SuffixProposer(Proposer):
    method = "suffix"
    SUPPORTS_ASYNC_SCHEDULING = True
    device_native = False  # host-side: it reads the committed tokens (OnHost applies them first)
    follows_every_step = True  # its index catches up on every step, drafting or not

    def __init__(self, num_speculative_tokens: int, depth: int, max_cached_requests: int, max_spec_factor: float,
                 min_token_prob: float, lib: Any = None) -> None:
        """``lib``: the native index (native/suffix_index.py's ``load()``); ``None``: the Python reference."""
        super().__init__(num_speculative_tokens)
        self.depth, self.max_spec_factor, self.min_token_prob = depth, max_spec_factor, min_token_prob
        self.max_cached_requests = max_cached_requests
        self._lib = lib
        self.global_index = self._new_index()
        self._cached: deque[tuple[list[int], int]] = deque()  # (tokens, first output position) per request
        self._live: dict[str, RequestState] = {}

    @classmethod
    def build(cls, config: SpeculativeConfig, **_: Any) -> SuffixProposer:
        # The index in C where native kernels are on (the engine's resolved ``execution.native``), else Python:
        # the same drafts (tests/native/test_suffix_index.py), without an interpreter step per update.
        return cls(config.num_speculative_tokens, config.suffix_decoding_max_tree_depth,
                   config.suffix_decoding_max_cached_requests, config.suffix_decoding_max_spec_factor,
                   config.suffix_decoding_min_token_prob, native_index.load())

    def _new_index(self) -> SuffixIndex | native_index.NativeSuffixIndex:
        if self._lib is None:
            return SuffixIndex(self.depth)
        return native_index.NativeSuffixIndex(self._lib, self.depth)

    def _own_index(self, st: RequestState) -> tuple[SuffixIndex, list[int]]:
        """The request's index, caught up with its committed tokens; and those tokens."""
        tokens = st.prompt_token_ids + st.output_token_ids
        index, done = st.proposer_state.get(_KEY, (None, 0))  # type: ignore[misc]
        if index is None:
            index = self._new_index()
        index.add(tokens, done)
        st.proposer_state[_KEY] = (index, len(tokens))
        return index, tokens

    def draft(self, index: SuffixIndex | native_index.NativeSuffixIndex, tokens: list[int], limit: int) -> list[int]:
        """Up to ``limit`` drafts continuing ``tokens`` (see the module docstring)."""
        if self._lib is not None:  # both indexes native (``_new_index``), at this proposer's depth
            return native_index.draft(index, self.global_index, tokens, limit, OWN_WEIGHT,  # type: ignore[arg-type]
                                      self.max_spec_factor, self.min_token_prob)
        ctx, drafts, score = list(tokens), [], 1.0
        while len(drafts) < limit:
            counts: dict[int, int] = {}
            match = 0
            for n, key in reversed(list(enumerate(_context_hashes(ctx, len(ctx), self.depth), 1))):
                own, cached = index.counts(key), self.global_index.counts(key)
                if own or cached:
                    counts = {tok: OWN_WEIGHT * c for tok, c in (own or {}).items()}
                    for tok, c in (cached or {}).items():
                        counts[tok] = counts.get(tok, 0) + c
                    match = n
                    break
            if not counts:
                break
            if not drafts:
                limit = min(limit, max(1, int(self.max_spec_factor * match)))
            tok, c = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
            score *= c / sum(counts.values())
            if score < self.min_token_prob:
                break
            drafts.append(tok)
            ctx.append(tok)
        return drafts

    def propose_one(self, st: RequestState, limit: int) -> list[int]:
        """One request's drafts (its index caught up with its committed tokens first)."""
        self._live[st.req_id] = st
        index, tokens = self._own_index(st)
        return self.draft(index, tokens, limit) if limit > 0 else []

    def follow(self, states: list[RequestState]) -> None:
        for st in states:
            self.propose_one(st, 0)  # the index caught up, nothing drafted

    def propose(self, inp: ProposeInput) -> list[list[int]]:
        assert inp.max_drafts_host is not None
        return [self.propose_one(st, limit) for st, limit in zip(inp.states, inp.max_drafts_host)]

    def remove_requests(self, req_ids: set[str]) -> None:
        """A request that leaves (finished, or preempted) lends its outputs to the global index."""
        for rid in req_ids:
            st = self._live.pop(rid, None)
            if st is None or not st.output_token_ids or self.max_cached_requests <= 0:
                continue
            tokens = st.prompt_token_ids + st.output_token_ids
            self.global_index.add(tokens, st.num_prompt_tokens)
            self._cached.append((tokens, st.num_prompt_tokens))
            while len(self._cached) > self.max_cached_requests:
                old, start = self._cached.popleft()
                self.global_index.add(old, start, sign=-1)
