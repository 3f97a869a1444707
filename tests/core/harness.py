"""Drive an EngineCore over the fake runner and record every delivered token (shared by core tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tandem.core.async_scheduler import AsyncScheduler
from tandem.core.interface import EngineCoreOutput
from tandem.core.request import Request
from tandem.core.scheduler import Scheduler
from tandem.core.spec_policy import make_policy
from tandem.engine.core import EngineCore
from tandem.sampling_params import SamplingParams
from tests.core.fake_runner import FakeExecutor, FakeModel, FakeRunner


@dataclass
class Delivered:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    finishes: int = 0
    num_cached_tokens: int = 0
    drafts: int = 0
    accepted: int = 0


def make_engine(
    *,
    async_scheduling: bool,
    num_blocks: int = 256,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 512,
    k: int = 0,
    prefix_caching: bool = True,
    model: FakeModel | None = None,
    draft_error_rate: float = 0.3,
    enable_chunked_prefill: bool = True,
    spec_policy: str = "fixed",
    step_cost: tuple[float, float, float] = (1e-3, 1e-4, 1e-5),
    spec_method: str = "ngram",
) -> tuple[EngineCore, FakeRunner]:
    runner = FakeRunner(
        model or FakeModel(),
        num_spec_tokens=k,
        async_scheduling=async_scheduling,
        max_model_len=max_model_len,
        draft_error_rate=draft_error_rate,
        step_cost=step_cost,
    )
    cls = AsyncScheduler if async_scheduling else Scheduler
    sched = cls(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        num_kv_blocks=num_blocks,
        block_size=block_size,
        enable_prefix_caching=prefix_caching,
        num_speculative_tokens=k,
        enable_chunked_prefill=enable_chunked_prefill,
        spec_policy=make_policy(spec_policy, k, spec_method, clock=runner.clock) if k else None,
    )
    core = EngineCore(sched, FakeExecutor(runner), async_scheduling=async_scheduling,
                      debug_invariants=True)
    return core, runner


def make_request(rid: str, prompt: list[int], eos: int = 0, seed: int = 0, **params) -> Request:
    params.setdefault("temperature", 0.0)
    return Request(rid, prompt, SamplingParams(**params), eos_token_ids=frozenset({eos}), seed=seed)


def record(delivered: dict[str, Delivered], outs: list[EngineCoreOutput]) -> None:
    for o in outs:
        d = delivered.setdefault(o.req_id, Delivered())
        assert d.finish_reason is None, f"{o.req_id}: output after finish"
        d.tokens.extend(o.new_token_ids)
        d.drafts += o.num_draft_tokens
        d.accepted += o.num_accepted_tokens
        if o.new_token_ids:
            d.num_cached_tokens = o.num_cached_tokens
        if o.finish_reason is not None:
            d.finish_reason = o.finish_reason
            d.finishes += 1


def run_to_completion(
    core: EngineCore,
    requests: list[Request] | None = None,
    *,
    max_steps: int = 100_000,
    on_step: Callable[[int, EngineCore, dict[str, Delivered]], None] | None = None,
) -> dict[str, Delivered]:
    delivered: dict[str, Delivered] = {}
    for req in requests or []:
        core.add_request(req)
    steps = 0
    while core.has_unfinished_requests():
        steps += 1
        assert steps < max_steps, "engine did not finish"
        record(delivered, core.step())
        if on_step is not None:
            on_step(steps, core, delivered)
    assert_all_free(core)
    return delivered


def assert_all_free(core: EngineCore) -> None:
    sched = core.scheduler
    assert not sched.requests and not sched.running and not sched.waiting
    assert sched.kv.all_free(), "KV blocks leaked"
    sched.kv.pool.check_invariants()
