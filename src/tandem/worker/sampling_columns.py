"""Each slot's sampling parameters as columns of per-batch tensors, written once when a request is admitted.

A step whose rows need nothing but temperature, top-k, top-p, min-p, seeds and logprobs (the common case)
gathers its :class:`SamplingMetadata` from these columns: a few ``index_select`` calls instead of one
``RowSpec`` per row and a host list per parameter every step. A request with penalties, a logit bias, an
allowed-token list, ``min_tokens`` or bad words is *special*: a step holding one builds its metadata row by
row (``SamplingMetadata.build``), which also sees the row's token history.
"""

from __future__ import annotations

import torch

from tandem.sample.metadata import SamplingMetadata
from tandem.sample.rng import position_key
from tandem.sampling_params import SamplingParams


class SamplingColumns:
    def __init__(self, max_reqs: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.temperature = torch.ones(max_reqs, dtype=torch.float32, device=device)
        self.top_k = torch.full((max_reqs,), vocab_size, dtype=torch.int64, device=device)
        self.top_p = torch.ones(max_reqs, dtype=torch.float32, device=device)
        self.min_p = torch.zeros(max_reqs, dtype=torch.float32, device=device)
        self.greedy_mask = torch.ones(max_reqs, dtype=torch.bool, device=device)
        # Host copies of what decides the fast-path flags: the slots where a flag is on (a step tests its
        # rows against each set at C speed).
        self.seed = [0] * max_reqs
        self.logprobs: dict[int, int] = {}  # slot -> top logprobs asked
        self.random: set[int] = set()  # not greedy
        self.special: set[int] = set()
        self.scaled: set[int] = set()  # temperature != 1 on a random row
        self.top_k_on: set[int] = set()
        self.top_p_on: set[int] = set()
        self.min_p_on: set[int] = set()

    def set(self, slot: int, params: SamplingParams, seed: int) -> None:
        greedy = params.greedy
        v = self.vocab_size
        top_k = v if greedy or params.top_k == -1 else min(params.top_k, v)
        temp = 1.0 if greedy else params.temperature
        top_p = 1.0 if greedy else params.top_p
        min_p = 0.0 if greedy else params.min_p
        self.temperature[slot], self.top_k[slot], self.top_p[slot], self.min_p[slot] = temp, top_k, top_p, min_p
        self.greedy_mask[slot] = greedy
        self.seed[slot] = seed
        self.logprobs.pop(slot, None)
        if params.logprobs is not None:
            self.logprobs[slot] = params.logprobs
        special = bool(
            params.has_penalties or params.logit_bias or params.allowed_token_ids is not None
            or params.min_tokens or params.bad_words
        )
        for flags, on in ((self.random, not greedy), (self.special, special), (self.scaled, temp != 1.0),
                          (self.top_k_on, top_k != v), (self.top_p_on, top_p != 1.0), (self.min_p_on, min_p != 0.0)):
            if on:
                flags.add(slot)
            else:
                flags.discard(slot)

    def metadata(self, row_slots: list[int], positions: list[int]) -> SamplingMetadata | None:
        """Metadata for rows of non-special requests: row i belongs to slot ``row_slots[i]`` and samples
        output position ``positions[i]``; ``None`` if a row belongs to a special request."""
        if not self.special.isdisjoint(row_slots):
            return None
        n = len(row_slots)
        random = self.random
        all_greedy = random.isdisjoint(row_slots)
        if all_greedy:
            is_greedy, keys = (True,) * n, (0,) * n
        else:
            seed = self.seed
            is_greedy = tuple(s not in random for s in row_slots)
            keys = tuple(position_key(seed[s], p) if s in random else 0 for s, p in zip(row_slots, positions))
        logprobs = [self.logprobs[s] for s in row_slots if s in self.logprobs] if self.logprobs else None
        # A column is gathered only where one of the rows has its flag on.
        cols: list[torch.Tensor | None] = [None] * 5
        pairs = ((self.top_k_on, self.top_k), (self.top_p_on, self.top_p), (self.min_p_on, self.min_p),
                 (self.scaled, self.temperature), (None if all_greedy else random, self.greedy_mask))
        idx = None
        for i, (on, values) in enumerate(pairs):
            if on is not None and not on.isdisjoint(row_slots):
                if idx is None:
                    idx = torch.tensor(row_slots, dtype=torch.int64).to(self.device, non_blocking=True)
                cols[i] = values.index_select(0, idx)
        top_k, top_p, min_p, temperature, greedy_mask = cols
        if greedy_mask is None:
            greedy_mask = torch.ones(n, dtype=torch.bool, device=self.device)
        return SamplingMetadata(
            num_rows=n,
            vocab_size=self.vocab_size,
            device=self.device,
            all_greedy=all_greedy,
            all_random=not any(is_greedy),
            no_penalties=True,
            no_top_k=top_k is None,
            no_top_p=top_p is None,
            no_min_p=min_p is None,
            max_num_logprobs=max(logprobs) if logprobs else None,
            is_greedy=is_greedy,
            generator_keys=keys,
            greedy_mask=greedy_mask,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            penalties=None,
            logit_bias=None,
            allowed=None,
            min_tokens_ban=None,
        )
