"""The host record of one slot of the worker's input batch (``input_batch.py``).

The runner never reads scheduler objects. It learns a request once (``NewRequestData``), then tracks it
itself: it appends the tokens it samples, advances its own computed frontier by the *accepted* count and
keeps the drafts it proposed. That is why async scheduling needs no host round trip for the next input:
step N+1's placeholder input token and ``-1`` draft slots are read from here, and its positions start at
this state's true frontier, whatever the scheduler's logical frontier says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from tandem.core.interface import NewRequestData
from tandem.core.limits import draft_slots, remaining_tokens
from tandem.sampling_params import SamplingParams


@dataclass
class RequestState:
    req_id: str
    slot: int  # its row of the input batch
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    block_ids: list[int]
    num_computed_tokens: int  # true frontier: tokens whose KV is written and valid
    drafts: list[int] = field(default_factory=list)  # proposed last step, verified next step
    group_block_ids: list[list[int]] = field(default_factory=list)  # KV cache groups 1.. (windowed models)
    prompt_logprobs_done: int = 0  # prompt positions whose logprobs were already returned
    # Proposer-private state (e.g. a draft model's own frontier, EAGLE's last hidden state).
    proposer_state: dict[str, object] = field(default_factory=dict)
    # Pooling runner, MEAN: the sum of the prompt's hidden states so far and their count (worker/pooler.py).
    pool_sum: object = None
    pool_count: int = 0

    @classmethod
    def from_new(cls, nr: NewRequestData, slot: int) -> RequestState:
        return cls(
            req_id=nr.req_id,
            slot=slot,
            prompt_token_ids=list(nr.prompt_token_ids),
            output_token_ids=list(nr.output_token_ids),
            sampling_params=nr.sampling_params,
            seed=nr.seed,
            block_ids=list(nr.block_ids),
            num_computed_tokens=nr.num_computed_tokens,
            group_block_ids=[list(g) for g in nr.group_block_ids],
        )

    @cached_property
    def num_prompt_tokens(self) -> int:  # (a prompt never changes)
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_at(self, i: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < n else self.output_token_ids[i - n]

    def tokens(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def all_tokens(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def max_drafts(self, k: int, max_model_len: int) -> int:
        """Drafts worth proposing: the next verify may emit 1 + drafts tokens, never past a limit."""
        return draft_slots(k, remaining_tokens(self.num_tokens, len(self.prompt_token_ids),
                                               self.sampling_params.max_tokens, max_model_len))
