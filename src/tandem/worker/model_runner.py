"""The model runner: one step = update own states, build the flat batch, forward, sample or verify,
commit the accepted tokens to its own states, propose the next drafts, report plain data.

Runs on the worker (a thread of the engine process, or a worker process). It never touches scheduler
objects; its request states are the worker-side copy that async scheduling relies on (see
``request_state.py``). Named sync point: the sampled ids are copied to the host (``_to_host``) at the end
of each step so the runner can extend its token lists; on CPU this costs nothing, on CUDA it is the one
wait per step, taken on the worker while the engine thread keeps scheduling.
"""

from __future__ import annotations

import torch

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput, TokenLogprobs
from tandem.model.forward_batch import KVCache
from tandem.model.transformer import CausalLM
from tandem.sample import RejectionSampler, RowSpec, Sampler, SamplingMetadata
from tandem.sample.sampler import LogprobsTensors, compute_logprobs
from tandem.spec_decode.proposer import ProposeInput, Proposer
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.input_prep import RequestPlan, StepInputs, prepare_inputs
from tandem.worker.request_state import RequestState


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        *,
        max_model_len: int,
        eos_token_ids: frozenset[int],
        async_scheduling: bool,
        proposer: Proposer | None = None,
        num_spec_tokens: int = 0,
        tracer: Tracer = NULL_TRACER,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        self.async_scheduling = async_scheduling
        self.proposer = proposer
        self.k = num_spec_tokens if proposer is not None else 0
        self.tracer = tracer
        self.device = model.device
        self.vocab_size = model.args.vocab_size
        self.states: dict[str, RequestState] = {}
        self.sampler = Sampler()
        self.rejection_sampler = RejectionSampler(self.sampler)

    # -- state -------------------------------------------------------------------------------------------
    def _update_states(self, so: SchedulerOutput) -> None:
        gone = so.finished_req_ids | so.preempted_req_ids
        for rid in gone:
            self.states.pop(rid, None)
        if gone and self.proposer is not None:
            self.proposer.remove_requests(gone)
        for nr in so.scheduled_new_reqs:
            self.states[nr.req_id] = RequestState.from_new(nr)
        for cr in so.scheduled_cached_reqs:
            self.states[cr.req_id].block_ids.extend(cr.new_block_ids)

    # -- one step ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        # The "execute" span is the step's device window: the trace analysis measures how much of the
        # host's scheduling of the next step falls inside it.
        with self.tracer.span("execute", track="device", step=so.step_id) as span:
            out = self._execute(so)
            if out.num_valid_drafts is not None:
                span.args["drafts"] = sum(out.num_valid_drafts)
                span.args["accepted"] = sum(max(len(t) - 1, 0) for t in out.sampled_token_ids)
            span.args["reqs"] = len(out.req_ids)
        return out

    def _execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        tr = self.tracer
        with tr.span("prepare_inputs", track="device", step=so.step_id):
            self._update_states(so)
            if so.is_empty:
                return ModelRunnerOutput.empty()
            step = prepare_inputs(
                so,
                self.states,
                block_size=self.block_size,
                max_model_len=self.max_model_len,
                num_spec_tokens=self.k,
                device=self.device,
            )
        aux = self.proposer.aux_hidden_layers if self.proposer is not None else ()
        with tr.span("forward", track="device", step=so.step_id, tokens=step.batch.num_tokens):
            out = self.model(step.batch, self.kv_cache, aux_hidden_layers=aux)
            rows = step.batch.logits_indices
            hidden = out.hidden_states if rows is None else out.hidden_states[rows]
            logits = self.model.compute_logits(hidden) if step.logits_rows else None
        sampling = [p for p in step.plans if p.samples]
        sampled: list[list[int]] = []
        logprobs: list[list[TokenLogprobs]] | None = None
        if sampling and logits is not None:
            name = "rejection_sample" if step.any_valid_drafts else "sample"
            with tr.span(name, track="device", step=so.step_id, reqs=len(sampling)):
                sampled, lp = self._sample(step, sampling, logits)
                logprobs = self._logprobs(sampling, sampled, lp) if lp is not None else None
        prompt_lp = self._prompt_logprobs(step, logits) if logits is not None else {}
        by_req = {p.state.req_id: toks for p, toks in zip(sampling, sampled)}
        self._commit(step, by_req)
        drafts = self._propose(so.step_id, step, sampling, sampled, out) if self.k else None

        req_ids = [p.state.req_id for p in step.plans]
        lp_by_req = dict(zip([p.state.req_id for p in sampling], logprobs or []))
        drafts_by_req = dict(zip([p.state.req_id for p in sampling], drafts or []))
        return ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=[by_req.get(rid, []) for rid in req_ids],
            spec_token_ids=(
                None if self.async_scheduling or not self.k
                else [drafts_by_req.get(rid, []) for rid in req_ids]
            ),
            num_valid_drafts=[p.num_valid if p.samples else 0 for p in step.plans],
            logprobs=[lp_by_req.get(rid, []) for rid in req_ids] if logprobs is not None else None,
            prompt_logprobs=prompt_lp,
        )

    # -- sampling ----------------------------------------------------------------------------------------
    def _rows(self, plans: list[RequestPlan]) -> list[RowSpec]:
        rows = []
        for p in plans:
            st = p.state
            for j in range(p.num_valid + 1):
                rows.append(
                    RowSpec(
                        params=st.sampling_params,
                        prompt_token_ids=st.prompt_token_ids,
                        output_token_ids=st.output_token_ids + p.drafts[:j],
                        seed=st.seed,
                        position=len(st.output_token_ids) + j,
                        eos_token_ids=self.eos_token_ids,
                    )
                )
        return rows

    def _sample(
        self, step: StepInputs, plans: list[RequestPlan], logits: torch.Tensor
    ) -> tuple[list[list[int]], LogprobsTensors | None]:
        idx = [step.row_to_logit[r] for p in plans for r in p.sample_rows]
        rows_logits = logits[torch.tensor(idx, device=logits.device)]
        meta = SamplingMetadata.build(self._rows(plans), self.vocab_size, logits.device)
        if not step.any_valid_drafts:
            out = self.sampler(rows_logits, meta)
            return [[t] for t in self._to_host(out.sampled_token_ids)], out.logprobs
        width = self.k  # fixed width: the uniforms drawn per request must not depend on the batch
        drafts = torch.tensor(
            [p.drafts[: p.num_valid] + [-1] * (width - p.num_valid) for p in plans],
            dtype=torch.int64,
        ).to(logits.device)
        res = self.rejection_sampler(rows_logits, meta, drafts, [p.num_valid for p in plans])
        return [[t for t in row if t >= 0] for row in self._to_host(res.output_token_ids)], res.logprobs

    @staticmethod
    def _to_host(t: torch.Tensor) -> list:
        """The step's one device->host copy of sampled ids (a sync point on CUDA)."""
        return t.tolist()

    def _logprobs(
        self, plans: list[RequestPlan], sampled: list[list[int]], lp: LogprobsTensors
    ) -> list[list[TokenLogprobs]]:
        ids, vals, ranks = lp.logprob_token_ids.tolist(), lp.logprobs.tolist(), lp.selected_token_ranks.tolist()
        out, row = [], 0
        for p, toks in zip(plans, sampled):
            n = p.state.sampling_params.logprobs
            entries = []
            if n is not None:
                for j in range(len(toks)):
                    r = row + j
                    entries.append(TokenLogprobs(toks[j], vals[r][0], ranks[r], ids[r][1 : n + 1], vals[r][1 : n + 1]))
            out.append(entries)
            row += p.num_valid + 1
        return out

    def _prompt_logprobs(
        self, step: StepInputs, logits: torch.Tensor
    ) -> dict[str, list[TokenLogprobs | None]]:
        result: dict[str, list[TokenLogprobs | None]] = {}
        for p in step.plans:
            if not p.prompt_logprob_rows:
                continue
            st = p.state
            first_pos = p.start_pos + (p.prompt_logprob_rows[0] - p.row_start)
            targets = [st.prompt_token_ids[first_pos + 1 + j] for j in range(len(p.prompt_logprob_rows))]
            idx = torch.tensor([step.row_to_logit[r] for r in p.prompt_logprob_rows], device=logits.device)
            n = st.sampling_params.prompt_logprobs or 0
            lp = compute_logprobs(logits[idx], torch.tensor(targets, device=logits.device), n)
            ids, vals, ranks = lp.logprob_token_ids.tolist(), lp.logprobs.tolist(), lp.selected_token_ranks.tolist()
            entries: list[TokenLogprobs | None] = [None] if first_pos == 0 else []
            entries += [
                TokenLogprobs(t, vals[j][0], ranks[j], ids[j][1 : n + 1], vals[j][1 : n + 1])
                for j, t in enumerate(targets)
            ]
            st.prompt_logprobs_done = first_pos + len(targets)
            result[st.req_id] = entries
        return result

    # -- commit and propose ------------------------------------------------------------------------------
    def _commit(self, step: StepInputs, sampled: dict[str, list[int]]) -> None:
        """Advance the runner's own frontier by the *accepted* count and append the sampled tokens."""
        for p in step.plans:
            st = p.state
            non_spec = p.num_tokens - p.num_slots
            toks = sampled.get(st.req_id)
            if toks is None:
                st.num_computed_tokens = p.start_pos + non_spec
                continue
            st.num_computed_tokens = p.start_pos + non_spec + len(toks) - 1
            st.output_token_ids.extend(toks)
            st.drafts = []

    def _propose(
        self,
        step_id: int,
        step: StepInputs,
        plans: list[RequestPlan],
        sampled: list[list[int]],
        out: object,
    ) -> list[list[int]]:
        prefill = [p.state for p in step.plans if not p.samples]
        if self.proposer is None or (not plans and not (prefill and self.proposer.needs_lookahead_slots)):
            return []
        with self.tracer.span("propose", track="device", step=step_id, reqs=len(plans)):
            hidden = {-1: out.hidden_states}  # type: ignore[attr-defined]
            for layer, h in zip(self.proposer.aux_hidden_layers, out.aux_hidden_states):  # type: ignore[attr-defined]
                hidden[layer] = h
            inp = ProposeInput(
                states=[p.state for p in plans],
                num_accepted=[len(t) - 1 for t in sampled],
                max_drafts=[p.state.max_drafts(self.k, self.max_model_len) for p in plans],
                batch=step.batch,
                hidden_states=hidden,
                sample_rows=[p.sample_rows for p in plans],
                prefill_states=prefill,
            )
            drafts = self.proposer.propose(inp)
        for p, d in zip(plans, drafts):
            p.state.drafts = list(d)
        return drafts
