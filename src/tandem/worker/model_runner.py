"""The model runner: one step = update states, build the flat batch from device state, forward, sample
or verify, commit on the device, propose the next drafts on the device, report.

Runs on the worker (a thread of the engine process, or a worker process). It never touches scheduler
objects. Each request lives twice on the worker: ``DeviceState`` (what the next step's inputs are read
from; updated with device ops only) and ``RequestState`` (the host mirror used for sampling metadata,
host-side proposers and outputs). Reconciling the host mirror with a step's results needs that step's
sampled ids on the host — the one device->host copy per step:
- default: the runner reconciles at the end of the step (a wait on the worker, traced as
  ``wait_accepted_counts``) before returning its output;
- ``deferred_reconciliation``: the runner returns at once and reconciles step N only after step N+1's
  forward has been launched, from inputs that the device corrected itself (positions, slot mapping,
  sequence lengths, input ids). The engine materializes step N's output from the same copy.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.model.forward_batch import KVCache
from tandem.model.transformer import CausalLM
from tandem.sample import RejectionSampler, RowSpec, Sampler, SamplingMetadata
from tandem.sample.sampler import LogprobsTensors, compute_logprobs
from tandem.spec_decode.proposer import ProposeInput, Proposer
from tandem.structured.manager import StructuredOutputManager
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.device_state import DeviceState
from tandem.worker.input_prep import RequestPlan, StepInputs, prepare_inputs
from tandem.worker.pending import LazyRunnerOutput, PendingStep, PromptLogprobs
from tandem.worker.request_state import RequestState


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        *,
        max_model_len: int,
        max_num_seqs: int,
        eos_token_ids: frozenset[int],
        async_scheduling: bool,
        deferred_reconciliation: bool = False,
        proposer: Proposer | None = None,
        num_spec_tokens: int = 0,
        tracer: Tracer = NULL_TRACER,
        structured: StructuredOutputManager | None = None,
    ) -> None:
        if deferred_reconciliation and not async_scheduling:
            raise ValueError("deferred_reconciliation needs async scheduling")
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        self.async_scheduling = async_scheduling
        self.deferred = deferred_reconciliation
        self.proposer = proposer
        self.k = num_spec_tokens if proposer is not None else 0
        self.tracer = tracer
        # Grammars and bad-word ids. Matchers advance only in _apply_tokens (committed tokens), which
        # runs before the next step samples in every mode (end of step, deferred reconcile, or a
        # host-side drafter's early apply), so masks start from the committed state.
        self.structured = structured
        self.device = model.device
        self.vocab_size = model.args.vocab_size
        self.states: dict[str, RequestState] = {}
        max_blocks = -(-(max_model_len + self.k + 1) // self.block_size)
        # Room for requests the scheduler already finished but whose removal arrives with a later step.
        self.dev = DeviceState(2 * max_num_seqs + 2, max_model_len, max_blocks, self.k, self.device,
                               num_groups=len(model.kv_groups))
        self.sampler = Sampler()
        self.rejection_sampler = RejectionSampler(self.sampler)
        self._pending: PendingStep | None = None  # deferred: the last step not reconciled yet
        # Requests the engine aborted after scheduling steps that are still queued here
        # (:meth:`abandon`); dropped when a step removes them.
        self.abandoned: set[str] = set()

    # -- state -------------------------------------------------------------------------------------------
    def abandon(self, req_ids: Iterable[str]) -> None:
        """The engine aborted these requests (a client went away); a queued step that computes nothing else
        is skipped (:meth:`_execute`). Called from the engine's thread: one set update, atomic."""
        self.abandoned.update(req_ids)

    def _update_states(self, so: SchedulerOutput) -> None:
        gone = so.finished_req_ids | so.preempted_req_ids
        self.abandoned.difference_update(gone)
        for rid in gone:
            self.states.pop(rid, None)
            self.dev.remove(rid)
        if gone and self.proposer is not None:
            self.proposer.remove_requests(gone)
        if gone and self.structured is not None:
            self.structured.remove_requests(gone)
        for nr in so.scheduled_new_reqs:
            st = RequestState.from_new(nr)
            if self.structured is not None:  # a resumed request replays its committed outputs
                self.structured.add_request(nr.req_id, nr.sampling_params, nr.output_token_ids)
            self.states[nr.req_id] = st
            self.dev.add(nr.req_id, st.all_tokens(), nr.num_computed_tokens, st.block_ids, st.group_block_ids)
        for cr in so.scheduled_cached_reqs:
            st = self.states[cr.req_id]
            slot = self.dev.slot_of[cr.req_id]
            self.dev.set_blocks(slot, len(st.block_ids), cr.new_block_ids)
            st.block_ids.extend(cr.new_block_ids)
            for g, new in enumerate(cr.new_group_block_ids):
                if g == len(st.group_block_ids):
                    st.group_block_ids.append([])
                self.dev.set_blocks(slot, len(st.group_block_ids[g]), new, group=g + 1)
                st.group_block_ids[g].extend(new)

    def _only_abandoned(self, so: SchedulerOutput) -> bool:
        """Whether every request of ``so`` was aborted after it was scheduled: then nothing of the step is
        needed (a long prefill chunk of an abandoned request is not computed). Safe for the ledgers: the
        scheduler ignores late outputs of finished requests, caches only blocks of steps that came back
        (``Request.completed_frontier``), and the next step removes the requests here."""
        if not self.abandoned or self.deferred or self._pending is not None:
            return False
        return all(rid in self.abandoned for rid in so.num_scheduled_tokens)

    # -- one step ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput | LazyRunnerOutput:
        # The "execute" span is the step's device window: the trace analysis measures how much of the
        # host's scheduling of the next step falls inside it.
        with self.tracer.span("execute", track="device", step=so.step_id) as span:
            out = self._execute(so)
            span.args["reqs"] = so.num_reqs
        return out

    def _execute(self, so: SchedulerOutput) -> ModelRunnerOutput | LazyRunnerOutput:
        tr = self.tracer
        with tr.span("prepare_inputs", track="device", step=so.step_id):
            self._update_states(so)
            if so.is_empty or self._only_abandoned(so):
                return ModelRunnerOutput.empty()
            stale = set(self._pending.req_ids) if self._pending is not None else set()
            step = prepare_inputs(
                so, self.states, self.dev, block_size=self.block_size, stale=stale, device=self.device
            )
        aux = self.proposer.aux_hidden_layers if self.proposer is not None else ()
        with tr.span("forward", track="device", step=so.step_id, tokens=step.batch.num_tokens):
            fwd = self.model(step.batch, self.kv_cache, aux_hidden_layers=aux)
            rows = step.batch.logits_indices
            hidden = fwd.hidden_states if rows is None else fwd.hidden_states[rows]
            logits = self.model.compute_logits(hidden) if step.logits_rows else None
        if self._pending is not None:
            # Deferred reconciliation: the host learns step N's results only now, after step N+1 was
            # launched from device-corrected inputs.
            with tr.span("reconcile", track="device", step=self._pending.step_id):
                self._reconcile(self._pending)
            self._pending = None
        prompt_lp = self._prompt_logprobs(step, logits) if logits is not None else {}
        sampling = step.sampling
        sampled = torch.empty(0, 1, dtype=torch.int64, device=self.device)
        lp: LogprobsTensors | None = None
        num_valid: list[int] = []
        num_invalid: list[int] = []
        if sampling:
            assert logits is not None
            name = "rejection_sample" if any(p.num_slots for p in sampling) else "sample"
            with tr.span(name, track="device", step=so.step_id, reqs=len(sampling)) as span:
                sampled, lp, num_valid, num_invalid = self._sample(step, sampling, logits)
                span.args["drafts"] = sum(num_valid)
        self._commit_on_device(step, sampled)
        drafts, applied = None, False
        # A drafter with its own KV (EAGLE / MTP) also sees steps where no request samples.
        if self.k and (sampling or self.proposer.needs_prefill_steps):  # type: ignore[union-attr]
            drafts, applied = self._propose(so.step_id, step, sampled, fwd)
        pending = PendingStep(
            step_id=so.step_id,
            req_ids=[p.req_id for p in step.plans],
            sampling=sampling,
            sampled=sampled,
            drafts=drafts,
            num_valid=num_valid,
            num_invalid=num_invalid,
            logprobs=lp,
            prompt_logprobs=prompt_lp,
            send_drafts=not self.async_scheduling and self.k > 0,
            tokens_applied=applied,
        )
        if self.deferred:
            self._pending = pending
            return LazyRunnerOutput(pending)
        with tr.span("wait_accepted_counts", track="wait", step=so.step_id):
            self._reconcile(pending)
        return pending.materialize()

    # -- sampling ----------------------------------------------------------------------------------------
    def _host_drafts(self, p: RequestPlan) -> list[int]:
        drafts = p.host_drafts if p.host_drafts is not None else p.state.drafts
        return (list(drafts[: p.num_slots]) + [-1] * p.num_slots)[: p.num_slots]

    def _sample(
        self, step: StepInputs, plans: list[RequestPlan], logits: torch.Tensor
    ) -> tuple[torch.Tensor, LogprobsTensors | None, list[int], list[int]]:
        """Sampled ids [B, K+1], logprobs, verified drafts and grammar-cut drafts per request."""
        drafts_of: list[list[int]] = []  # per request: the drafts really verified, no -1
        for p in plans:
            st, drafts = p.state, self._host_drafts(p)
            valid = 0
            while valid < len(drafts) and drafts[valid] >= 0:
                valid += 1
            drafts_of.append(drafts[: min(valid, st.max_drafts(self.k, self.max_model_len))])
        masks = None
        if self.structured is not None:
            # Grammar masks for every verify row; drafts the grammar refuses are cut (invalid).
            masks = self.structured.verify_masks(
                [p.req_id for p in plans], drafts_of, [p.num_slots + 1 for p in plans]
            )
        num_valid = masks.num_valid if masks is not None else [len(d) for d in drafts_of]
        num_invalid = [len(d) - n for d, n in zip(drafts_of, num_valid)]
        rows = []
        for p, drafts, n_valid in zip(plans, drafts_of, num_valid):
            st, drafts = p.state, drafts[:n_valid]
            bad = (
                self.structured.bad_words_ids(st.sampling_params.bad_words)
                if self.structured is not None
                else ()
            )
            for j in range(p.num_slots + 1):
                rows.append(
                    RowSpec(
                        params=st.sampling_params,
                        prompt_token_ids=st.prompt_token_ids,
                        # context = committed outputs + the valid draft prefix; never a -1 slot
                        output_token_ids=st.output_token_ids + drafts[:j],
                        seed=st.seed,
                        position=len(st.output_token_ids) + j,
                        eos_token_ids=self.eos_token_ids,
                        bad_words_token_ids=bad,
                    )
                )
        idx = [step.row_to_logit[r] for p in plans for r in p.sample_rows]
        if idx == list(range(logits.shape[0])):
            rows_logits = logits  # every logits row samples, in order (plain decode): no [N, V] copy
        else:
            rows_logits = logits.index_select(0, torch.tensor(idx, device=logits.device))
        if masks is not None:
            rows_logits = masks.apply(rows_logits)
        meta = SamplingMetadata.build(rows, self.vocab_size, logits.device)
        if not any(p.num_slots for p in plans):
            out = self.sampler(rows_logits, meta)
            return out.sampled_token_ids.view(-1, 1), out.logprobs, num_valid, num_invalid
        # Fixed width k: the uniforms drawn per request must not depend on the batch.
        slots = torch.tensor([p.slot for p in plans], device=self.device)
        draft_ids = self.dev.drafts.index_select(0, slots)[:, : self.k].clone()
        keep = torch.arange(self.k, device=self.device) < torch.tensor(num_valid, device=self.device).unsqueeze(1)
        draft_ids = torch.where(keep, draft_ids, torch.full_like(draft_ids, -1))
        res = self.rejection_sampler(rows_logits, meta, draft_ids, [p.num_slots for p in plans])
        return res.output_token_ids, res.logprobs, num_valid, num_invalid

    def _prompt_logprobs(self, step: StepInputs, logits: torch.Tensor) -> dict[str, PromptLogprobs]:
        """Device tensors; the host sees them with the step's one copy (``PendingStep``)."""
        result: dict[str, PromptLogprobs] = {}
        for p in step.plans:
            if not p.prompt_logprob_rows:
                continue
            st, first = p.state, p.prompt_logprob_start
            targets = [st.prompt_token_ids[first + 1 + j] for j in range(len(p.prompt_logprob_rows))]
            idx = torch.tensor([step.row_to_logit[r] for r in p.prompt_logprob_rows], device=logits.device)
            n = st.sampling_params.prompt_logprobs or 0
            lp = compute_logprobs(logits[idx], torch.tensor(targets, device=logits.device), n)
            st.prompt_logprobs_done = first + len(targets)
            result[st.req_id] = PromptLogprobs(first, targets, n, lp)
        return result

    # -- commit, reconcile, propose ----------------------------------------------------------------------
    def _commit_on_device(self, step: StepInputs, sampled: torch.Tensor) -> None:
        """Device-side: append sampled tokens, advance each frontier by what was really accepted."""
        idx = step.sampling_index()
        if idx:
            i_t = torch.tensor(idx, device=self.device)
            known = torch.tensor([step.plans[i].num_known for i in idx], device=self.device)
            accepted = (sampled >= 0).sum(dim=1) - 1
            slots = torch.tensor([step.plans[i].slot for i in idx], device=self.device)
            self.dev.commit(slots, sampled, step.base.index_select(0, i_t) + known + accepted)
        for i, p in enumerate(step.plans):
            if not p.samples:  # prefill chunk: frontier exact on the host too
                self.dev.num_computed[p.slot] = step.base[i] + p.num_tokens
                p.state.num_computed_tokens += p.num_tokens

    def _apply_tokens(self, plans: list[RequestPlan], sampled: list[list[int]]) -> None:
        for p, toks in zip(plans, sampled):
            st = self.states.get(p.req_id)
            if st is None or st is not p.state:
                continue  # finished or preempted meanwhile
            st.num_computed_tokens += p.num_known + len(toks) - 1
            st.output_token_ids.extend(toks)
            if self.structured is not None:
                self.structured.accept(p.req_id, toks)

    def _reconcile(self, pending: PendingStep) -> None:
        """Host mirror: append the step's sampled tokens, frontier by accepted count, keep the drafts."""
        sampled, drafts = pending.host()
        if not pending.tokens_applied:
            self._apply_tokens(pending.sampling, sampled)
        for i, p in enumerate(pending.sampling):
            if self.states.get(p.req_id) is p.state:
                p.state.drafts = drafts[i] if drafts is not None else []

    def _propose(
        self, step_id: int, step: StepInputs, sampled: torch.Tensor, fwd: object
    ) -> tuple[torch.Tensor, bool]:
        """Next drafts [B, k] (-1 padded) on the device; True when host tokens were applied."""
        assert self.proposer is not None
        plans = step.sampling
        applied = False
        with self.tracer.span("propose", track="device", step=step_id, reqs=len(plans)):
            slots = torch.tensor([p.slot for p in plans], dtype=torch.int64, device=self.device)
            hidden = {-1: fwd.hidden_states}  # type: ignore[attr-defined]
            for layer, h in zip(self.proposer.aux_hidden_layers, fwd.aux_hidden_states):  # type: ignore[attr-defined]
                hidden[layer] = h
            inp = ProposeInput(
                states=[p.state for p in plans],
                slots=slots,
                dev=self.dev,
                sampled=sampled,
                max_drafts=self._max_drafts(plans, slots),
                batch=step.batch,
                hidden_states=hidden,
                sample_rows=[p.sample_rows for p in plans],
                prefill_states=[p.state for p in step.plans if not p.samples],
            )
            if not self.proposer.device_native:
                # A host-side drafter needs this step's tokens on the host: apply them now (a wait).
                with self.tracer.span("wait_accepted_counts", track="wait", step=step_id):
                    lists = [[t for t in row if t >= 0] for row in sampled.tolist()]
                self._apply_tokens(plans, lists)
                applied = True
                inp.num_accepted = [len(t) - 1 for t in lists]
                inp.max_drafts_host = [p.state.max_drafts(self.k, self.max_model_len) for p in plans]
            drafts = self.proposer.propose(inp)
            if isinstance(drafts, list):
                drafts = torch.tensor(
                    [(d + [-1] * self.k)[: self.k] for d in drafts], dtype=torch.int64
                ).to(self.device).view(len(plans), self.k)
            self.dev.set_drafts(slots, drafts)
        return drafts, applied

    def _max_drafts(self, plans: list[RequestPlan], slots: torch.Tensor) -> torch.Tensor:
        """Exact per-request draft cap on the device: never past max_tokens or max_model_len."""
        n_tokens = self.dev.num_tokens.index_select(0, slots)
        prompt = torch.tensor([p.state.num_prompt_tokens for p in plans], device=self.device)
        max_tok = torch.tensor(
            [p.state.sampling_params.max_tokens or (1 << 40) for p in plans], device=self.device
        )
        limit = torch.minimum(self.max_model_len - n_tokens - 1, max_tok - (n_tokens - prompt) - 1)
        return limit.clamp(min=0, max=self.k)
