"""Turning validated prompts and sampling params into engine ``Request`` objects.

Shared by the offline ``LLM`` and the server's ``AsyncLLM`` so both validate the same way: every
prompt and every parameter is checked before anything enters the engine, and ``n > 1`` fans out into
child requests ``{parent}-{i}`` whose seeds (when the user gave one) are ``seed + i``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from tandem.core.limits import prompt_fits
from tandem.core.request import Request
from tandem.engine.builder import Engine
from tandem.engine.prompts import Prompt
from tandem.sampling_params import SamplingParams
from tandem.structured.grammar import check_structured_outputs


class MadeRequest(NamedTuple):
    request: Request
    prompt: Prompt
    sample_index: int  # which of the parent's n samples
    parent_id: str


class RequestFactory:
    """Not thread-safe: use it from one thread (the caller's, or the server's event loop)."""

    def __init__(self, engine: Engine, seed: int) -> None:
        self.tokenizer = engine.tokenizer
        self.vocab_size = engine.plan.args.vocab_size
        self.max_model_len = engine.plan.max_model_len
        self.num_kv_blocks = engine.plan.num_kv_blocks
        self.max_logprobs = engine.plan.config.model.max_logprobs  # -1: the vocabulary
        self.eos_token_ids = engine.tokenizer.eos_token_ids | frozenset(
            engine.plan.args.eos_token_ids
        )
        self._rng = random.Random(seed)
        self._next_id = 0

    def next_id(self) -> str:
        rid = f"{self._next_id}"
        self._next_id += 1
        return rid

    def prompt_ids(self, prompt: Prompt, truncate: int | None = None) -> list[int]:
        """The prompt's token ids (its last ``truncate`` ones; -1: the most that still leave room for one
        output token), checked against the vocabulary and the context length."""
        ids = prompt.token_ids(self.tokenizer)
        if truncate is not None:
            ids = ids[-(self.max_model_len - 1 if truncate == -1 else truncate):]
        if not ids:
            raise ValueError("prompt is empty")
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"prompt_token_ids must lie in [0, {self.vocab_size})")
        if not prompt_fits(len(ids), self.max_model_len):
            raise ValueError(
                f"prompt is {len(ids)} tokens, longer than max_model_len - 1 "
                f"({self.max_model_len - 1}; "
                f"max_model_len is bounded by the model and by the KV cache's "
                f"{self.num_kv_blocks} blocks)"
            )
        return ids

    def make(
        self,
        prompts: Sequence[Prompt],
        params: Sequence[SamplingParams],
        parent_ids: Sequence[str] | None = None,
    ) -> list[MadeRequest]:
        """Validate everything, then build the requests (nothing is built if anything is invalid)."""
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling_params for {len(prompts)} prompts")
        if parent_ids is not None and len(parent_ids) != len(prompts):
            raise ValueError(f"got {len(parent_ids)} request ids for {len(prompts)} prompts")
        checked = []
        params = [self._own_copy(sp) for sp in params]
        for prompt, sp in zip(prompts, params):
            sp.check_vocab(self.vocab_size)
            check_structured_outputs(sp.structured_outputs)  # a bad schema / regex / EBNF: 400
            checked.append(self.prompt_ids(prompt, sp.truncate_prompt_tokens))
        made = []
        for j, (prompt, sp, ids) in enumerate(zip(prompts, params, checked)):
            parent = parent_ids[j] if parent_ids is not None else self.next_id()
            for i in range(sp.n):
                child = (
                    sp
                    if sp.n == 1
                    else sp.clone(n=1, seed=None if sp.seed is None else sp.seed + i)
                )
                rid = parent if sp.n == 1 else f"{parent}-{i}"
                req = Request(
                    rid,
                    ids,
                    child,
                    eos_token_ids=self.eos_token_ids,
                    seed=self._rng.getrandbits(63),
                    max_model_len=self.max_model_len,
                )
                made.append(MadeRequest(req, prompt, i, parent))
        return made

    def _own_copy(self, sp: SamplingParams) -> SamplingParams:
        """The engine's copy of ``sp`` (the caller may change its object later), with -1 logprobs as the
        vocabulary's size; more logprobs than ``max_logprobs`` is a ``ValueError`` naming the field."""
        fixes = {}
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(sp, name)
            if value is None:
                continue
            limit = self.vocab_size if self.max_logprobs == -1 else self.max_logprobs
            wanted = self.vocab_size if value == -1 else value
            if wanted > limit:
                raise ValueError(f"{name}={value} is more than the engine's max_logprobs ({self.max_logprobs}); "
                                 "raise max_logprobs")
            if value == -1:
                fixes[name] = wanted
        return sp.clone(**fixes)
