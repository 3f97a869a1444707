"""Scheduler-level counters: speculative decoding (vLLM metric names), preemptions, tokens. Pure Python."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    """Totals since start (or since the last reset). Mean acceptance length counts the bonus token."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    # Drafts a structured-output grammar refused before verification (not in num_draft_tokens).
    num_invalid_spec_tokens: int = 0

    def observe(self, num_draft_tokens: int, num_accepted: int, num_invalid: int = 0) -> None:
        self.num_invalid_spec_tokens += num_invalid
        if num_draft_tokens <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_draft_tokens:
            self.accepted_per_pos.extend([0] * (num_draft_tokens - len(self.accepted_per_pos)))
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_pos": list(self.accepted_per_pos),
            "num_invalid_spec_tokens": self.num_invalid_spec_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
        }


@dataclass
class SchedulerCounters:
    num_steps: int = 0
    num_preemptions: int = 0
    num_prompt_tokens: int = 0  # prompt tokens of requests added
    num_generation_tokens: int = 0  # committed output tokens
    num_stale_outputs: int = 0  # outputs that arrived for preempted steps and were ignored
    num_finished: int = 0
    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)
