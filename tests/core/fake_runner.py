"""A scripted fake model runner (no torch) that honours the runner side of the scheduler contract.

It keeps its own per-request state exactly like the real runner (token history, its own computed-token
frontier, the drafts it proposed), so async scheduling's ``-1`` slots are filled from runner memory, and
positions follow the *accepted* counts, not the scheduler's logical frontier.

The "model" is a deterministic function of (request seed, context): ``next_token(seed, context)``. Drafts
are the model's own continuation, corrupted with a deterministic per-position probability, so accepted
counts vary while greedy outputs stay a pure function of the prompt: sync and async runs must agree.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future
from dataclasses import dataclass, field

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.executor.base import Executor
from tandem.sampling_params import SamplingParams


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


@dataclass
class _ReqState:
    tokens: list[int]
    num_prompt: int
    num_computed: int
    params: SamplingParams
    seed: int
    drafts: list[int] = field(default_factory=list)


class FakeModel:
    def __init__(self, vocab_size: int = 64, eos_token_id: int = 0, eos_rate: float = 0.0) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.eos_rate = eos_rate

    def next_token(self, seed: int, context: list[int]) -> int:
        h = _h(seed, len(context), tuple(context[-4:]))
        if self.eos_rate and (h % 10_000) < self.eos_rate * 10_000:
            return self.eos_token_id
        return 1 + (h >> 16) % (self.vocab_size - 1)


class FakeRunner:
    def __init__(
        self,
        model: FakeModel,
        *,
        num_spec_tokens: int = 0,
        draft_error_rate: float = 0.3,
        async_scheduling: bool = False,
        max_model_len: int = 1 << 30,
        step_cost: tuple[float, float, float] = (1e-3, 1e-4, 1e-5),
    ) -> None:
        self.model = model
        # (fixed, per token, per drafted token) seconds each step takes on the runner's clock (``clock``): the
        # clock advances when the engine takes the step's output, as a device finishing it would.
        self.step_cost = step_cost
        self.now = 0.0
        self.last_cost = 0.0
        self.num_drafted = 0  # draft tokens proposed, in all
        self.k = num_spec_tokens
        self.draft_error_rate = draft_error_rate
        self.async_scheduling = async_scheduling
        self.max_model_len = max_model_len
        self.state: dict[str, _ReqState] = {}
        self.steps = 0

    def clock(self) -> float:
        return self.now

    def _propose(self, rid: str, st: _ReqState, k: int) -> list[int]:
        n_out = len(st.tokens) - st.num_prompt
        limit = k
        if st.params.max_tokens is not None:
            limit = min(limit, st.params.max_tokens - n_out - 1)
        limit = min(limit, self.max_model_len - len(st.tokens) - 1)
        drafts: list[int] = []
        ctx = list(st.tokens)
        for j in range(max(limit, 0)):
            t = self.model.next_token(st.seed, ctx)
            h = _h("draft", rid, len(ctx), j)
            if (h % 1000) < self.draft_error_rate * 1000:
                t = 1 + (t + 1 + h % 7) % (self.model.vocab_size - 1)
            if h % 97 == 0:  # now and then the proposer finds nothing beyond this point
                break
            drafts.append(t)
            ctx.append(t)
        return drafts

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self.steps += 1
        for rid in so.finished_req_ids | so.preempted_req_ids:
            self.state.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            assert nr.req_id not in self.state, f"{nr.req_id} added twice"
            self.state[nr.req_id] = _ReqState(
                tokens=nr.prompt_token_ids + nr.output_token_ids,
                num_prompt=len(nr.prompt_token_ids),
                num_computed=nr.num_computed_tokens,
                params=nr.sampling_params,
                seed=nr.seed,
            )
        req_ids, sampled, spec, valid = [], [], [], []
        k = self.k if so.num_drafts_to_propose is None else so.num_drafts_to_propose
        assert k <= self.k
        for rid, n in so.num_scheduled_tokens.items():
            st = self.state[rid]
            slots = so.scheduled_spec_decode_tokens.get(rid, [])
            if any(t != -1 for t in slots):
                assert not self.async_scheduling, "async scheduling sent real draft ids"
                drafts = list(slots)
            else:
                drafts = (st.drafts + [-1] * len(slots))[: len(slots)]
            non_spec = n - len(slots)
            # The inputs the runner feeds must all be known to it (no -1 reaches the embedding).
            assert st.num_computed + non_spec <= len(st.tokens), (rid, st.num_computed, non_spec)
            st.num_computed += non_spec
            req_ids.append(rid)
            if st.num_computed < len(st.tokens):
                assert not slots, "drafts scheduled on a prefill chunk"
                sampled.append([])
                spec.append([])
                valid.append(0)
                continue
            out, ctx = [], list(st.tokens)
            n_valid = sum(1 for t in drafts if t != -1)
            for j in range(len(drafts) + 1):
                t = self.model.next_token(st.seed, ctx)
                out.append(t)
                ctx.append(t)
                if j == len(drafts) or drafts[j] != t:
                    break
            st.num_computed += len(out) - 1  # accepted drafts' KV is valid
            st.tokens.extend(out)
            st.drafts = self._propose(rid, st, k) if k else []
            sampled.append(out)
            spec.append(list(st.drafts))
            valid.append(n_valid)
        out = ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=sampled,
            spec_token_ids=None if self.async_scheduling else spec,
            num_valid_drafts=valid,
        )
        drafted = k * sum(1 for s in sampled if s) if self.k else 0
        self.num_drafted += drafted
        fixed, per_token, per_draft = self.step_cost
        self.last_cost = fixed + per_token * so.total_num_scheduled_tokens + per_draft * drafted
        return out


class _Timed(Future):
    """A resolved future that advances the runner's clock by its step's cost when first read."""

    def __init__(self, runner: FakeRunner) -> None:
        super().__init__()
        self.runner, self.cost, self.read = runner, 0.0, False

    def result(self, timeout: float | None = None) -> ModelRunnerOutput:
        if not self.read:
            self.read = True
            self.runner.now += self.cost
        return super().result(timeout)


class FakeExecutor(Executor):
    """Runs the fake runner at launch; the future resolves at once (ordering is what matters)."""

    name = "fake"
    SUPPORTS_ASYNC_SCHEDULING = True

    def __init__(self, runner: FakeRunner) -> None:
        self.runner = runner

    def execute_model(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        fut: Future[ModelRunnerOutput] = _Timed(self.runner)
        try:
            fut.set_result(self.runner.execute(scheduler_output))
            fut.cost = self.runner.last_cost  # type: ignore[attr-defined]
        except Exception as exc:  # surfaced by the engine as an executor failure
            fut.set_exception(exc)
        return fut


class SyncOnlyFakeExecutor(FakeExecutor):
    """A test-only executor that declares no async support (shows the contract working)."""

    name = "sync_only"
    SUPPORTS_ASYNC_SCHEDULING = False
