"""The model runner: one step = update states, build the flat batch from device state, forward, sample
or verify, commit on the device, propose the next drafts on the device, report.

Runs on the worker (a thread of the engine process, or a worker process). It never touches scheduler
objects. Each running request holds one slot of the persistent ``InputBatch``: its device row (what the
next step's inputs are read from; updated with device ops only), its sampling columns and its host record
(``RequestState``: sampling context, host-side proposers, outputs).

One mode of execution: every step returns a ``PendingStep`` (the step's device tensors and their one
device->host copy), which the engine side materializes. Reconciling the host records with a step's
results needs that copy; only *when* the runner reads it differs:
- default: at the end of the step (a wait on the worker, traced as ``wait_accepted_counts``);
- ``deferred_reconciliation``: after step N+1's forward has been launched, from inputs that the device
  corrected itself (positions, slot mapping, sequence lengths, input ids).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tandem.core.interface import SchedulerOutput
from tandem.model.forward_batch import KVCache
from tandem.model.transformer import CausalLM
from tandem.sample import RejectionSampler, RowSpec, Sampler, SamplingMetadata
from tandem.sample.sampler import LogprobsTensors, compute_logprobs
from tandem.spec_decode.proposer import OnHost, Proposer
from tandem.speculative_config import TreeConfig
from tandem.structured.manager import StructuredOutputManager
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.drafting import Drafting
from tandem.worker.input_batch import InputBatch
from tandem.worker.input_prep import RequestPlan, StepInputs, prepare_inputs
from tandem.worker.pending import PendingStep, PromptLogprobs
from tandem.worker.pooler import Pooler
from tandem.worker.tree_step import TreeSteps


class ModelRunner(Drafting):
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
        pooler: Pooler | None = None,
        tree: TreeConfig | None = None,
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
        if proposer is not None and not proposer.device_native:
            proposer = OnHost(proposer, max_model_len, tracer)
        self.proposer = proposer
        self.k = num_spec_tokens if proposer is not None else 0
        # Draft trees (worker/tree_step.py); None: chains.
        self.tree = (TreeSteps.create(tree, model, proposer, kv_cache, self.k, max_model_len)
                     if tree is not None and self.k else None)
        self.tree_nodes = tree.max_nodes if self.tree is not None else 0
        self.tracer = tracer
        # Grammars and bad-word ids. Matchers advance only in _apply_tokens (committed tokens), which
        # runs before the next step samples in every mode (end of step, deferred reconcile, or a
        # host-side drafter's early apply), so masks start from the committed state.
        self.structured = structured
        self.pooler = pooler  # runner "pooling": each prompt's pooled hidden state rides with its step's output
        self.device = model.device
        self.vocab_size = model.args.vocab_size
        bad = [t for t in eos_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"eos_token_ids: {bad[0]} is outside the vocabulary ({self.vocab_size})")
        max_blocks = -(-(max_model_len + self.k + 1) // self.block_size)
        # Room for requests the scheduler already finished but whose removal arrives with a later step.
        self.batch = InputBatch(2 * max_num_seqs + 2, max_model_len, max_blocks, self.k, self.device,
                                vocab_size=self.vocab_size, num_groups=len(model.kv_groups),
                                tree_nodes=self.tree_nodes)
        self.sampler = Sampler()
        self.rejection_sampler = RejectionSampler(self.sampler)
        if self.tree is not None:
            self.tree.batch, self.tree.sampler = self.batch, self.sampler
        self._pending: PendingStep | None = None  # deferred: the last step not reconciled yet
        # Requests the engine aborted after scheduling steps that are still queued here
        # (:meth:`abandon`); dropped when a step removes them.
        self.abandoned: set[str] = set()

    # -- state -------------------------------------------------------------------------------------------
    def abandon(self, req_ids: Iterable[str]) -> None:
        """The engine aborted these requests (a client went away); a queued step that computes nothing else
        is skipped (:meth:`execute_model`). Called from the engine's thread: one set update, atomic."""
        self.abandoned.update(req_ids)

    def _update_states(self, so: SchedulerOutput) -> None:
        gone = so.finished_req_ids | so.preempted_req_ids
        if gone:
            self.abandoned.difference_update(gone)
            for rid in gone:
                self.batch.remove(rid)
            if self.proposer is not None:
                self.proposer.remove_requests(gone)
            if self.structured is not None:
                self.structured.remove_requests(gone)
        for nr in so.scheduled_new_reqs:
            self.batch.add(nr)
            if self.structured is not None:  # a resumed request replays its committed outputs
                self.structured.add_request(nr.req_id, nr.sampling_params, nr.output_token_ids)
        self.batch.append_blocks(so.scheduled_cached_reqs)

    def _only_abandoned(self, so: SchedulerOutput) -> bool:
        """Whether every request of ``so`` was aborted after it was scheduled: then nothing of the step is
        needed (a long prefill chunk of an abandoned request is not computed). Safe for the ledgers: the
        scheduler ignores late outputs of finished requests, caches only blocks of steps that came back
        (``Request.completed_frontier``), and the next step removes the requests here."""
        if self.deferred or self._pending is not None:
            return False
        return all(rid in self.abandoned for rid in so.num_scheduled_tokens)

    # -- one step ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> PendingStep:
        # The "execute" span is the step's device window: the trace analysis measures how much of the
        # host's scheduling of the next step falls inside it.
        with self.tracer.span("execute", track="device", step=so.step_id, reqs=len(so.num_scheduled_tokens)):
            tr = self.tracer
            with tr.span("prepare_inputs", track="device", step=so.step_id):
                self._update_states(so)
                if not so.num_scheduled_tokens or (self.abandoned and self._only_abandoned(so)):
                    return PendingStep.empty(self.device)
                stale = set(self._pending.req_ids) if self._pending is not None else set()
                step = prepare_inputs(so, self.batch, block_size=self.block_size, stale=stale, device=self.device,
                                      tree_nodes=self.tree_nodes)
            # Drafts asked for the next step (the speculation policy's choice).
            k_step = self.k if so.num_drafts_to_propose is None else min(self.k, so.num_drafts_to_propose)
            # A drafter with its own KV (EAGLE / MTP) runs over prompt chunks and over steps that draft; a
            # decode-only step that drafts nothing skips it (and the target's features it would read): its KV
            # keeps a gap at those positions, which later drafts attend over. Outputs never depend on it
            # (drafts are verified); acceptance after a gap may be lower, and the policy measures that. While
            # the policy has settled on no drafts (``so.drafter_prefill`` False) prompt chunks skip it too: the
            # scheduler never has those requests drafted (``Request.drafter_gap``).
            kv_pass = bool(self.k and self.proposer.needs_prefill_steps  # type: ignore[union-attr]
                           and (k_step or (so.drafter_prefill and any(p.num_known > 1 for p in step.plans))))
            aux = self.proposer.aux_hidden_layers if kv_pass else ()  # type: ignore[union-attr]
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
            prompt_lp = self._prompt_logprobs(step, logits) if step.any_prompt_logprobs and logits is not None else {}
            pooled = self.pooler(step.plans, fwd.hidden_states) if self.pooler is not None else {}
            sampling = step.sampling
            sampled = torch.empty(0, 1, dtype=torch.int64, device=self.device)
            lp: LogprobsTensors | None = None
            num_valid: list[int] = []
            num_invalid: list[int] = []
            verdict = None
            if sampling:
                assert logits is not None
                name = "rejection_sample" if any(p.num_slots for p in sampling) else "sample"
                with tr.span(name, track="device", step=so.step_id, reqs=len(sampling)) as span:
                    if self.tree is not None and any(p.num_slots for p in sampling):
                        idx = [step.row_to_logit[r] for p in sampling for r in p.sample_rows]
                        meta = self._sampling_metadata(sampling, [[] for _ in sampling], [0] * len(sampling))
                        contiguous = idx == list(range(idx[0], idx[0] + len(idx)))  # (the usual case: a view)
                        rows = logits[idx[0] : idx[0] + len(idx)] if contiguous else logits[idx]
                        verdict, lp = self.tree.verify(sampling, rows, meta)
                        sampled, num_valid, num_invalid = verdict.output_token_ids, [p.num_slots for p in sampling], []
                    else:
                        sampled, lp, num_valid, num_invalid = self._sample(step, sampling, logits)
                    span.args["drafts"] = sum(num_valid)
            self._commit_on_device(step, sampled)
            if verdict is not None:  # the accepted branches' K/V into the sequence before anything reads it
                assert self.tree is not None
                self.tree.move_accepted(step, verdict)
            drafts, applied, shadow = None, False, None
            if self.tree is not None and (sampling or kv_pass) and (so.draft_trees or so.tree_req_ids):
                with tr.span("propose", track="device", step=so.step_id, reqs=len(sampling), k=k_step):
                    drafts = self.tree.propose(step, fwd, verdict, k_step if kv_pass else None, so.draft_trees)
            elif self.k and (sampling or kv_pass):
                drafts, applied, shadow = self._propose(so, step, sampled, fwd, k_step, kv_pass)
                if self.tree is not None:  # chains after chains (the policy's choice): stored as chain trees
                    self.tree.store_chains(step.sampling, drafts)
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
                send_drafts=not self.async_scheduling and self.k > 0 and self.tree is None,
                tokens_applied=applied,
                pooled=pooled,
                shadow=shadow,
            )
            if self.deferred:
                self._pending = pending  # reconciled after the next step's forward is launched
            else:
                with tr.span("wait_accepted_counts", track="wait", step=so.step_id):
                    self._reconcile(pending)
            return pending

    # -- sampling ----------------------------------------------------------------------------------------
    def _sample(
        self, step: StepInputs, plans: list[RequestPlan], logits: torch.Tensor
    ) -> tuple[torch.Tensor, LogprobsTensors | None, list[int], list[int]]:
        """Sampled ids [B, K+1], logprobs, verified drafts and grammar-cut drafts per request."""
        # Per request: the drafts really verified this step, the valid prefix of its slots. Every proposer
        # already stops at the request's limits (``ProposeInput.max_drafts``, exact when it drafts: the tokens
        # of the step it drafts after are committed), so the prefix needs no second cap here.
        drafts_of: list[list[int]] = []
        for p in plans:
            drafts = [] if not p.num_slots else p.host_drafts if p.host_drafts is not None else p.state.drafts
            valid = 0
            while valid < p.num_slots and valid < len(drafts) and drafts[valid] >= 0:
                valid += 1
            drafts_of.append(list(drafts[:valid]))
        masks = None
        structured = self.structured
        if structured is not None and structured.grammars:
            # Grammar masks for every verify row; drafts the grammar refuses are cut (invalid).
            masks = structured.verify_masks([p.req_id for p in plans], drafts_of, [p.num_slots + 1 for p in plans])
        num_valid = masks.num_valid if masks is not None else [len(d) for d in drafts_of]
        num_invalid = [len(d) - n for d, n in zip(drafts_of, num_valid)]
        idx = [step.row_to_logit[r] for p in plans for r in p.sample_rows]
        if idx == list(range(logits.shape[0])):
            rows_logits = logits  # every logits row samples, in order (plain decode): no [N, V] copy
        else:
            rows_logits = logits.index_select(0, torch.tensor(idx, device=logits.device))
        if masks is not None:
            rows_logits = masks.apply(rows_logits)
        meta = self._sampling_metadata(plans, drafts_of, num_valid)
        if not any(p.num_slots for p in plans):
            out = self.sampler(rows_logits, meta)
            return out.sampled_token_ids.view(-1, 1), out.logprobs, num_valid, num_invalid
        # Fixed width k: the uniforms drawn per request must not depend on the batch.
        slots = torch.tensor([p.slot for p in plans], device=self.device)
        draft_ids = self.batch.drafts.index_select(0, slots)[:, : self.k]
        if self.device.type == "cpu":  # a few numbers: masked on host lists, not with four tensor ops
            host = [row[:n] + [-1] * (self.k - n) for row, n in zip(draft_ids.tolist(), num_valid)]
            draft_ids = torch.tensor(host, dtype=torch.int64)
        else:
            keep = torch.arange(self.k, device=self.device) < torch.tensor(num_valid, device=self.device).unsqueeze(1)
            draft_ids = torch.where(keep, draft_ids, torch.full_like(draft_ids, -1))
        res = self.rejection_sampler(rows_logits, meta, draft_ids, [p.num_slots for p in plans])
        return res.output_token_ids, res.logprobs, num_valid, num_invalid

    def _sampling_metadata(
        self, plans: list[RequestPlan], drafts_of: list[list[int]], num_valid: list[int]
    ) -> SamplingMetadata:
        """From the batch's sampling columns; row by row only when a request needs its token history
        (penalties, bad words, min_tokens) or per-token lists (logit bias, allowed ids)."""
        with self.tracer.span("sampling_metadata", track="device"):
            row_slots, positions = [], []
            for p in plans:
                n_out = len(p.state.output_token_ids)
                if p.num_slots:  # k + 1 rows of a chain; a tree's root and nodes
                    row_slots += [p.slot] * len(p.sample_rows)
                    positions += range(n_out, n_out + len(p.sample_rows))
                else:
                    row_slots.append(p.slot)
                    positions.append(n_out)
            meta = self.batch.sampling.metadata(row_slots, positions)
            if meta is not None:
                return meta
            rows = []
            for p, drafts, n_valid in zip(plans, drafts_of, num_valid):
                st, drafts = p.state, drafts[:n_valid]
                bad = self.structured.bad_words_ids(st.sampling_params.bad_words) if self.structured else ()
                for j in range(len(p.sample_rows)):  # (a tree's rows never need a history: no drafts here)
                    rows.append(RowSpec(
                        params=st.sampling_params,
                        prompt_token_ids=st.prompt_token_ids,
                        # context = committed outputs + the valid draft prefix; never a -1 slot
                        output_token_ids=st.output_token_ids + drafts[:j],
                        seed=st.seed,
                        position=len(st.output_token_ids) + j,
                        eos_token_ids=self.eos_token_ids,
                        bad_words_token_ids=bad,
                    ))
            return SamplingMetadata.build(rows, self.vocab_size, self.device, checked=True)

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
        idx = step.sampling_index
        if idx:
            i_t = torch.tensor(idx, device=self.device)
            known = torch.tensor([step.plans[i].num_known for i in idx], device=self.device)
            accepted = (sampled >= 0).sum(dim=1) - 1
            slots = torch.tensor([step.plans[i].slot for i in idx], device=self.device)
            self.batch.commit(slots, sampled, step.base.index_select(0, i_t) + known + accepted)
        for i, p in enumerate(step.plans):
            if not p.samples:  # prefill chunk: frontier exact on the host too
                self.batch.num_computed[p.slot] = step.base[i] + p.num_tokens
                p.state.num_computed_tokens += p.num_tokens

    def _apply_tokens(self, plans: list[RequestPlan], sampled: list[list[int]]) -> None:
        reqs, structured = self.batch.reqs, self.structured
        grammars = structured is not None and structured.grammars
        for p, toks in zip(plans, sampled):
            st = p.state
            if reqs.get(st.req_id) is not st:
                continue  # finished or preempted meanwhile
            st.num_computed_tokens += p.num_known + len(toks) - 1
            st.output_token_ids.extend(toks)
            if grammars:
                structured.accept(st.req_id, toks)  # type: ignore[union-attr]

    def _reconcile(self, pending: PendingStep) -> None:
        """Host records: append the step's sampled tokens, frontier by accepted count, keep the drafts."""
        sampled, drafts = pending.host()
        if not pending.tokens_applied:
            self._apply_tokens(pending.sampling, sampled)
        if drafts is not None:
            reqs = self.batch.reqs
            for p, d in zip(pending.sampling, drafts):
                if reqs.get(p.req_id) is p.state:
                    p.state.drafts = d
