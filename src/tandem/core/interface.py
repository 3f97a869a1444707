"""Plain-data contracts between the scheduler and the model runner. No torch, no references to
scheduler objects: both messages pickle cleanly across a process boundary.

``SchedulerOutput`` (scheduler -> runner), one per step:
- ``num_scheduled_tokens``: request id -> tokens to compute this step (prefill chunk, or 1 decode token
  plus its scheduled drafts); no prefill/decode flag, the runner derives it from its own state;
- ``scheduled_spec_decode_tokens``: request id -> drafts to verify; ``-1`` entries mean "the drafts you
  proposed last step and still hold on the device" (async scheduling);
- new requests carry everything the runner needs to build its state (prompt, committed outputs when the
  request resumes after preemption, blocks, computed tokens); running ones carry only their new blocks.

``ModelRunnerOutput`` (runner -> scheduler): per request in batch order the sampled tokens (accepted
drafts plus one recovered or bonus token; empty for a prefill chunk that does not reach the end of the
prompt), drafts for the next step (sync scheduling only), and logprobs when asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.sampling_params import SamplingParams


@dataclass(frozen=True)
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    # Committed outputs when the request resumes after a preemption (its KV is recomputed).
    output_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    block_ids: list[int]
    num_computed_tokens: int  # tokens already in KV (prefix-cache hit) before this step
    # KV cache groups 1.. of a sliding-window model (core/kv_cache_manager.py); empty otherwise.
    group_block_ids: list[list[int]] = field(default_factory=list)


@dataclass
class CachedRequestData:
    """The running requests scheduled again this step, as columns (one object per step, vLLM's layout)."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)  # per request; [] when its blocks suffice
    # the scheduler's logical frontier before this step (may include drafts), per request
    num_computed_tokens: list[int] = field(default_factory=list)
    # Blocks appended to groups 1.. (entries a window group released stay in the runner's table: never read);
    # per request, one list per group ([] for a model without window groups).
    new_group_block_ids: list[list[list[int]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.req_ids)


@dataclass
class SchedulerOutput:
    step_id: int
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]
    # Requests the runner must forget before this step (finished, aborted or preempted since last step).
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # Scheduler-side bookkeeping, not for the runner: each scheduled request's epoch (stale-output check).
    req_epochs: dict[str, int] = field(default_factory=dict)
    # Requests for which this step samples a token (their prompt is fully scheduled by this step).
    sampling_req_ids: set[str] = field(default_factory=set)
    # Drafts the proposer makes during this step for the next one (the speculation policy's choice,
    # 0 .. num_speculative_tokens); None: num_speculative_tokens.
    num_drafts_to_propose: int | None = None
    # Draft trees (speculative_config.tree): the requests whose verify this step is a tree (the root and all its
    # nodes, ``num_tree_rows`` rows in all beyond the scheduled tokens); whether this step drafts trees (else
    # chains) for the next one: the speculation policy's choice.
    tree_req_ids: set[str] = field(default_factory=set)
    num_tree_rows: int = 0
    draft_trees: bool = False
    # Shadow drafts (core/shadow.py): requests for which the worker makes up to ``num_shadow_drafts`` drafts
    # during this step without verifying them (a model-free drafter, on a step that drafts nothing), returned
    # in ``ModelRunnerOutput.shadow_token_ids``.
    shadow_req_ids: set[str] = field(default_factory=set)
    num_shadow_drafts: int = 0
    # Whether a draft head with its own KV (EAGLE, EAGLE-3, MTP) runs over this step's prompt chunks when it drafts
    # nothing (``num_drafts_to_propose`` 0): False while the adaptive policy has settled on no
    # drafts for the batch (core/spec_policy.py); the requests whose prompt chunk it skips are never drafted by it
    # (``Request.drafter_gap``).
    drafter_prefill: bool = True

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens

    @property
    def num_reqs(self) -> int:
        return len(self.num_scheduled_tokens)


@dataclass
class TokenLogprobs:
    """Logprobs for one sampled token: the sampled token's own plus the top-n alternatives."""

    token_id: int
    logprob: float
    rank: int
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    sampled_token_ids: list[list[int]]
    # Drafts for each request's next step; only filled when scheduling is synchronous (async keeps them on
    # the device). Empty list: no drafts.
    spec_token_ids: list[list[int]] | None = None
    # Per request, how many of the scheduled draft slots held a real draft (the rest were -1 slots the
    # proposer could not fill, or trimmed by max_tokens / max_model_len); feeds the acceptance stats so
    # they are identical with async on and off. None: every scheduled slot was a real draft.
    num_valid_drafts: list[int] | None = None
    # Per request, drafts a structured-output grammar refused (cut before verification, not counted
    # in num_valid_drafts). None: none this step.
    num_invalid_spec_tokens: list[int] | None = None
    logprobs: list[list[TokenLogprobs]] | None = None
    # req_id -> per-prompt-token logprobs (first entry None: nothing predicts the first token).
    prompt_logprobs: dict[str, list[TokenLogprobs | None]] = field(default_factory=dict)
    # Pooling runner: req_id -> the prompt's pooled hidden state, for requests whose prompt ended this step.
    pooled: dict[str, list[float]] = field(default_factory=dict)
    # req_id -> the drafts the worker made without verifying them (``SchedulerOutput.shadow_req_ids``),
    # continuing the request's tokens after this step's.
    shadow_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> ModelRunnerOutput:
        return cls(req_ids=[], sampled_token_ids=[])


@dataclass
class EngineCoreOutput:
    """What one step changed for one request, as the engine front end sees it."""

    req_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    error: str | None = None
    first_scheduled_time: float | None = None  # time.monotonic() of the request's first admission
    pooled: list[float] | None = None  # pooling runner: the prompt's embedding (with its one sampled token)
