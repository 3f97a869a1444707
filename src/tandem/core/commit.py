"""One request's part of a step that came back (``Scheduler.update_from_output``): the ledgers rolled back by the
drafts it rejected, its tokens appended one by one with stop checks, its full blocks cached, its statistics.
Pure Python, no torch.

Ledger writes (all of them the scheduler's, see ``core/scheduler.py``): ``C -= rejected``, ``PH -= 1 + drafts``;
tokens after a stop are dropped and C trimmed by them; blocks wholly before the completed frontier enter the
prefix cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.core.interface import EngineCoreOutput, ModelRunnerOutput
from tandem.core.request import InFlightStep, InvariantError, Request
from tandem.core.stop import check_stop

if TYPE_CHECKING:
    from tandem.core.scheduler import Scheduler


def commit_step(
    sched: Scheduler,
    req: Request,
    step: InFlightStep,
    sampled: list[int],
    out: ModelRunnerOutput,
    idx: int | None,
) -> EngineCoreOutput | None:
    prompt_lp = out.prompt_logprobs.get(req.request_id) if out.prompt_logprobs else None
    if not step.samples:
        if sampled:
            raise InvariantError(f"{req.request_id}: tokens returned for a prefill chunk")
        sched.kv.cache_blocks(req, req.completed_frontier)
        if prompt_lp is None:
            return None
        return EngineCoreOutput(req.request_id, [], prompt_logprobs=prompt_lp)
    if not 1 <= len(sampled) <= step.num_drafts + 1:
        raise InvariantError(
            f"{req.request_id}: {len(sampled)} tokens returned for {step.num_drafts} drafts"
        )
    num_accepted = len(sampled) - 1
    req.num_computed_tokens -= step.num_drafts - num_accepted
    req.num_output_placeholders -= step.num_placeholders
    num_valid = step.num_drafts
    num_invalid = 0
    if step.num_drafts:  # (a step without draft slots changes no statistic)
        if out.num_valid_drafts is not None and idx is not None:
            num_valid = out.num_valid_drafts[idx]
        if out.num_invalid_spec_tokens is not None and idx is not None:
            num_invalid = out.num_invalid_spec_tokens[idx]
        if num_valid > 0 or num_invalid:
            req.spec_stats.observe(num_valid, num_accepted, num_invalid)
            sched.counters.spec.observe(num_valid, num_accepted, num_invalid)
    if sched.num_spec_tokens and step.num_scheduled == step.num_drafts + 1:  # a decode step
        sched.spec_policy.observe_drafts(req, num_valid, num_accepted, step.tree, step.num_drafts)
    logprobs = out.logprobs[idx] if out.logprobs is not None and idx is not None else None

    new_tokens = sampled
    status = None
    for j, token in enumerate(sampled):
        req.output_token_ids.append(token)
        status = check_stop(req, token)
        if status is not None:
            req.status = status
            new_tokens = sampled[: j + 1]
            req.num_computed_tokens -= len(sampled) - len(new_tokens)  # drop the rest
            break
    sched.counters.num_generation_tokens += len(new_tokens)
    if status is None:
        sched.kv.cache_blocks(req, req.completed_frontier)
        if sched.num_spec_tokens:
            sched.spec_policy.observe_tokens(req, step.step_id, out.shadow_token_ids.get(req.request_id))
        if out.spec_token_ids is not None and idx is not None:
            req.spec_token_ids = list(out.spec_token_ids[idx])
    return EngineCoreOutput(
        req.request_id, list(new_tokens),
        new_logprobs=logprobs[: len(new_tokens)] if logprobs is not None else None, prompt_logprobs=prompt_lp,
        finish_reason=status.finish_reason if status is not None else None, stop_reason=req.stop_reason,
        num_cached_tokens=max(req.num_cached_tokens, 0), num_draft_tokens=num_valid,
        num_accepted_tokens=num_accepted, first_scheduled_time=req.first_scheduled_time,
        pooled=out.pooled.get(req.request_id) if out.pooled else None,
    )
