"""Continuous-batching scheduler. Pure Python, no torch.

Each step maps request -> number of tokens under ``max_num_batched_tokens`` and ``max_num_seqs``; prefill
chunks (whole prompts with ``enable_chunked_prefill`` off) and decodes (with drafts) mix freely. Running
requests go first in arrival order, then the waiting queue FCFS. When blocks run out, the most recently
admitted running request is preempted (recompute: its blocks are freed; it re-enters the queue's head).

Ledger writes (docs/SEMANTICS.md §2-3), all in this file:
- schedule: ``C += n``; ``PH += 1 + drafts`` for a step that samples; ``spec_token_ids`` consumed;
  an ``InFlightStep`` remembers what was promised.
- update_from_output (one request's part in ``core/commit.py``): ``C -= rejected``; ``PH -= 1 + drafts``; tokens
  appended one by one with stop checks; tokens after a stop are dropped and C trimmed by them; blocks before the
  completed frontier cached.
- preempt: blocks freed, ``C = PH = 0``, drafts and in-flight records dropped, ``epoch += 1`` so outputs of
  steps scheduled before the preemption are recognised as stale and change nothing.

This class is the synchronous scheduler; :class:`~tandem.core.async_scheduler.AsyncScheduler` adds what
async needs (draft placeholders, scheduling while a step is in flight) on top of the same methods.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from tandem.core.interface import (CachedRequestData, EngineCoreOutput, ModelRunnerOutput, NewRequestData,
                                   SchedulerOutput)
from tandem.core.kv_cache_manager import KVCacheManager
from tandem.core.limits import draft_slots
from tandem.core.commit import commit_step
from tandem.core.request import InFlightStep, InvariantError, Request, RequestStatus
from tandem.core.spec_policy import FixedPolicy
from tandem.core.stats import SchedulerCounters

RUNNING = RequestStatus.RUNNING


class Scheduler:
    is_async = False

    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        num_kv_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        num_speculative_tokens: int = 0,
        num_lookahead_tokens: int = 0,
        kv_group_windows: tuple[int, ...] = (0,),
        enable_chunked_prefill: bool = True,
        spec_policy: FixedPolicy | None = None,
        tree_nodes: int = 0,
    ) -> None:
        self.kv = KVCacheManager(num_kv_blocks, block_size, enable_prefix_caching, kv_group_windows,
                                 lookback=num_speculative_tokens + 1)
        self.kv.check_fits(max_model_len)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.max_model_len = max_model_len
        self.num_spec_tokens = num_speculative_tokens
        self.spec_policy = spec_policy or FixedPolicy(num_speculative_tokens)
        if self.spec_policy.shadows is not None:  # async: a slot scheduled before its drafts exist may stay empty
            self.spec_policy.shadows.empty_is_miss = self.is_async
        self.num_lookahead_tokens = num_lookahead_tokens
        # Draft trees (speculative_config.tree): a verify of k > 0 drafts feeds the tree's ``tree_nodes`` nodes
        # (rows beyond the k the ledgers count: the KV lookahead holds them, the token budget pays for them);
        # the drafts stay on the device in sync scheduling too (placeholders, as in async).
        self.tree_nodes = tree_nodes
        if tree_nodes and num_lookahead_tokens < tree_nodes:
            raise ValueError(f"num_lookahead_tokens {num_lookahead_tokens}: a tree of {tree_nodes} nodes needs "
                             "at least that many")
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._step_id = 0
        self._finished_for_runner: set[str] = set()
        self._preempted_for_runner: set[str] = set()
        self.counters = SchedulerCounters()

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    # -- admission ---------------------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self.kv.check_prompt(req.num_prompt_tokens, self.max_model_len)
        if req.max_model_len is None:
            req.max_model_len = self.max_model_len
        self.requests[req.request_id] = req
        self.waiting.append(req)
        self.counters.num_prompt_tokens += req.num_prompt_tokens

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def num_waiting(self) -> int:
        return len(self.waiting)

    def num_running(self) -> int:
        return len(self.running)

    # -- schedule ----------------------------------------------------------------------------------------
    def _can_schedule_running(self, req: Request) -> bool:
        """Sync: a running request always has exactly one known next token to feed."""
        return True

    def _room(self, req: Request) -> int:
        """Tokens a running request may still produce (sync: exactly; the async scheduler's counts each
        sampling step in flight as its one sure token)."""
        return req.remaining_tokens()

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        spec_tokens: dict[str, list[int]] = {}
        tree_req_ids: set[str] = set()
        tree_rows = 0
        new_reqs: list[NewRequestData] = []
        preempted_now = False
        k_of = self._plan_drafts() if self.num_spec_tokens else {}

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if not self._can_schedule_running(req):
                i += 1
                continue
            # Tokens up to the logical end (known tokens + in-flight placeholders), then the drafts.
            to_end = (len(req.prompt_token_ids) + len(req.output_token_ids) + req.num_output_placeholders
                      - req.num_computed_tokens)
            n_spec = k_of.get(req.request_id, 0) if to_end == 1 else 0
            n_new = min(to_end + n_spec, budget, self.max_model_len - req.num_computed_tokens)
            if n_new <= 0:
                i += 1
                continue
            # Mid-prefill, a smaller chunk before anyone is preempted (KVCacheManager.allocate_chunk).
            while not (fit := self.kv.allocate_chunk(req, n_new, None, self.num_lookahead_tokens, to_end > 1)):
                if to_end > 1:  # the smallest chunk was tried: retry that after preempting
                    n_new = min(n_new, self.block_size)
                victim = self.running.pop()
                self._preempt(victim)
                preempted_now = True
                if victim is req:
                    break
            if preempted_now and req.status != RequestStatus.RUNNING:
                break  # the request preempted itself: nothing further fits
            n_new = fit
            n_spec = max(0, n_new - to_end)
            num_scheduled[req.request_id] = n_new
            extra = 0
            if n_spec:
                spec_tokens[req.request_id] = req.spec_token_ids[:n_spec]
                if req.spec_tree:  # a tree verify: every node is a row
                    tree_req_ids.add(req.request_id)
                    extra = self.tree_nodes - n_spec
                    tree_rows += extra
            budget -= n_new + extra
            i += 1

        while self.waiting and budget > 0 and not preempted_now:
            if len(self.running) >= self.max_num_seqs:
                break
            req = self.waiting[0]
            # Prompt logprobs need every prompt position computed: no prefix-cache hits then.
            if req.sampling_params.prompt_logprobs is None:
                hits, num_hit = self.kv.get_computed_blocks(req)
            else:
                hits, num_hit = [], 0
            n_new = min(req.num_tokens - num_hit, budget)
            if not self.enable_chunked_prefill and n_new < req.num_tokens - num_hit:
                break  # whole or not at all; FCFS
            # Alone, a request must still get going: a smaller chunk where the whole prompt does not fit.
            n_new = self.kv.allocate_chunk(req, n_new, hits, self.num_lookahead_tokens, not self.running
                                           and self.enable_chunked_prefill)
            if not n_new:
                break  # FCFS: nobody overtakes the head of the queue
            self.waiting.popleft()
            req.num_computed_tokens = num_hit
            if req.num_cached_tokens < 0:  # first admission: counted once (a resumed request is not)
                req.num_cached_tokens = num_hit
                req.first_scheduled_time = time.monotonic()
                if req.sampling_params.prompt_logprobs is None and self.kv.enable_prefix_caching:
                    self.kv.record_query(req, num_hit)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            num_scheduled[req.request_id] = n_new
            budget -= n_new
            new_reqs.append(NewRequestData(
                req_id=req.request_id, prompt_token_ids=list(req.prompt_token_ids),
                output_token_ids=list(req.output_token_ids), sampling_params=req.sampling_params, seed=req.seed,
                block_ids=list(req.block_ids), num_computed_tokens=num_hit,
                group_block_ids=[list(g) for g in req.group_block_ids],
            ))

        # Running requests scheduled again: their new blocks (a new request sends all of its own).
        new_blocks, fresh = self.kv.take_new_blocks(), {nr.req_id for nr in new_reqs}
        cached = CachedRequestData([rid for rid in num_scheduled if rid not in fresh])
        for rid in cached.req_ids:
            new = new_blocks.get(rid) or ([],)
            cached.new_block_ids.append(new[0])
            cached.num_computed_tokens.append(self.requests[rid].num_computed_tokens)
            cached.new_group_block_ids.append(new[1:])

        self._step_id += 1
        out = SchedulerOutput(
            step_id=self._step_id,
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            scheduled_spec_decode_tokens=spec_tokens,
            num_drafts_to_propose=self.spec_policy.propose_k if self.num_spec_tokens else None,
            tree_req_ids=tree_req_ids,
            num_tree_rows=tree_rows,
            draft_trees=bool(self.tree_nodes) and self.spec_policy.propose_tree,
            shadow_req_ids=self.spec_policy.shadow(self._step_id) if self.num_spec_tokens else set(),
            num_shadow_drafts=self.spec_policy.shadow_depth,
            drafter_prefill=self.spec_policy.drafter_prefill,
        )
        if num_scheduled:
            # The runner learns what to forget with the next step it runs.
            out.finished_req_ids, self._finished_for_runner = self._finished_for_runner, set()
            out.preempted_req_ids, self._preempted_for_runner = self._preempted_for_runner, set()
            self.counters.num_steps += 1
        self._update_after_schedule(out)
        return out

    def _plan_drafts(self) -> dict[str, int]:
        """Drafts to verify per decoding request, as the speculation policy chooses (core/spec_policy.py)."""
        decode = []
        for r in self.running:
            if len(r.prompt_token_ids) + len(r.output_token_ids) + r.num_output_placeholders - r.num_computed_tokens != 1:
                continue  # not at its logical end: a prefill chunk, no drafts
            room = self._room(r)
            if room > 0:  # (a request that cannot be scheduled this step, _can_schedule_running, has none)
                # draft slots worth verifying: never past max_tokens or max_model_len
                slots = draft_slots(len(r.spec_token_ids), room) if r.spec_token_ids else 0
                if self.tree_nodes and slots and (not r.sampling_params.tree_verifiable
                                                  or r.num_computed_tokens + 1 + self.tree_nodes > self.max_model_len):
                    slots = 0  # its rows need their own histories, or the tree's rows would pass the context
                decode.append((r, slots))
        return self.spec_policy.plan(decode)

    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        """Advance C, promise placeholders, consume drafts, remember the step as in flight."""
        requests, spec = self.requests, out.scheduled_spec_decode_tokens
        epochs, sampling, step_id = out.req_epochs, out.sampling_req_ids, out.step_id
        for rid, n in out.num_scheduled_tokens.items():
            req = requests[rid]
            n_drafts = len(spec[rid]) if rid in spec else 0
            to_end = (len(req.prompt_token_ids) + len(req.output_token_ids) + req.num_output_placeholders
                      - req.num_computed_tokens)
            samples = n - n_drafts >= to_end
            if to_end > 1 and not out.drafter_prefill:  # a prompt chunk the draft head skips (spec_policy.py)
                req.drafter_gap = True
            epochs[rid] = req.epoch
            if samples:
                sampling.add(rid)
            step = InFlightStep(step_id, n, n_drafts, samples, 1 + n_drafts if samples else 0, rid in out.tree_req_ids)
            req.inflight.append(step)
            req.num_computed_tokens += n
            req.num_output_placeholders += step.num_placeholders
            if req.spec_token_ids:
                req.spec_token_ids = []
        if self.num_spec_tokens and (self.is_async or self.tree_nodes):
            # The runner proposes k drafts during this step; their values stay on the device (async: the host
            # sees them after the next step is scheduled; trees: a tree is not a list of ids).
            k = self.num_spec_tokens if out.num_drafts_to_propose is None else out.num_drafts_to_propose
            for rid in sampling:
                req = requests[rid]
                req.spec_token_ids = [-1] * k
                req.spec_tree = out.draft_trees

    # -- preemption, abort, finish -----------------------------------------------------------------------
    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_output_placeholders = 0
        req.spec_token_ids = []
        req.inflight.clear()
        req.epoch += 1
        req.num_preemptions += 1
        self.counters.num_preemptions += 1
        self.waiting.appendleft(req)
        self._preempted_for_runner.add(req.request_id)

    def finish_requests(self, req_ids: Iterable[str], status: RequestStatus) -> list[str]:
        """Finish requests from outside the step (abort, stop string); late outputs are ignored."""
        if not status.finished:
            raise ValueError(f"{status!r} is not a finished status")
        done = []
        for rid in req_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self._free_request(req, status)
            done.append(rid)
        return done

    def abort_requests(self, req_ids: Iterable[str]) -> list[str]:
        return self.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)

    def _free_request(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        if status != RequestStatus.FINISHED_ERROR:
            # Blocks completed by the request's last step enter the cache before its blocks are freed (a
            # max_tokens=1 prompt, a chat turn's last full block); only blocks wholly before the confirmed
            # frontier, as after every step. A failed step's KV is not trusted.
            self.kv.cache_blocks(req, req.completed_frontier)
        self.kv.free(req)
        req.num_output_placeholders = 0
        req.spec_token_ids = []
        req.inflight.clear()
        del self.requests[req.request_id]
        self.spec_policy.forget(req.request_id)
        self._finished_for_runner.add(req.request_id)
        self._preempted_for_runner.discard(req.request_id)
        self.counters.num_finished += 1

    # -- update --------------------------------------------------------------------------------------------
    def update_from_output(
        self, so: SchedulerOutput, out: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        index = {rid: i for i, rid in enumerate(out.req_ids)}
        results: list[EngineCoreOutput] = []
        finished: list[Request] = []
        requests, epochs, step_id = self.requests, so.req_epochs, so.step_id
        for rid in so.num_scheduled_tokens:
            req = requests.get(rid)
            if req is None:
                continue  # aborted or finished while the step was in flight
            if req.epoch != epochs[rid] or req.status != RUNNING:
                self.counters.num_stale_outputs += 1
                continue  # preempted after this step was scheduled: stale, changes nothing
            step = req.inflight.popleft()
            if step.step_id != step_id:
                raise InvariantError(f"{rid}: output of step {step_id}, expected {step.step_id}")
            idx = index.get(rid)
            result = commit_step(self, req, step, [] if idx is None else out.sampled_token_ids[idx], out, idx)
            if result is None:
                continue
            results.append(result)
            if result.finish_reason is not None:
                finished.append(req)
        for req in finished:
            self.running.remove(req)
            self._free_request(req, req.status)
        if self.num_spec_tokens:
            self.spec_policy.observe_step(so, bool(self.running))
        return results

    # -- invariants ------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        bs = self.block_size
        for req in self.requests.values():
            req.check_invariants(bs)
        running = {r.request_id for r in self.running}
        waiting = {r.request_id for r in self.waiting}
        if running & waiting or running | waiting != set(self.requests):
            raise InvariantError("running/waiting sets out of sync with live requests")
        for req in self.running:
            if req.status != RequestStatus.RUNNING:
                raise InvariantError(f"{req.request_id} in running with status {req.status.name}")
        for req in self.waiting:
            if req.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED) or req.block_ids:
                raise InvariantError(f"{req.request_id} waiting with status or blocks")
        if len(self.running) > self.max_num_seqs:
            raise InvariantError(f"{len(self.running)} running > max_num_seqs {self.max_num_seqs}")
        self.kv.check_invariants(self.requests)
        if not self.requests and not self.kv.all_free():
            raise InvariantError("no request left but KV blocks still held")
