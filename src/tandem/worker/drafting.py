"""The model runner's drafting (worker/model_runner.py): after a step's tokens are committed on the device, the
proposer makes the next step's drafts — as many as the speculation policy asked for (``num_drafts_to_propose``),
none on a step that drafts nothing — and, on such a step, the shadow drafts the policy asked for
(``SchedulerOutput.shadow_req_ids``, core/shadow.py): a model-free drafter's drafts for a few requests, made and
returned but never verified.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tandem.core.interface import SchedulerOutput
from tandem.core.limits import UNBOUNDED, remaining_tokens
from tandem.spec_decode.proposer import ProposeInput, committed_tokens

if TYPE_CHECKING:
    from tandem.spec_decode.proposer import Proposer
    from tandem.trace.tracer import Tracer
    from tandem.worker.input_batch import InputBatch
    from tandem.worker.input_prep import RequestPlan, StepInputs


class Drafting:
    """Mixed into ``ModelRunner``: its proposer, batch, device and token application."""

    proposer: Proposer | None
    batch: InputBatch
    device: torch.device
    tracer: Tracer
    k: int
    max_model_len: int

    def _apply_tokens(self, plans: list[RequestPlan], sampled: list[list[int]]) -> None:
        raise NotImplementedError

    def _propose(
        self, so: SchedulerOutput, step: StepInputs, sampled: torch.Tensor, fwd: object, k_step: int, kv_pass: bool
    ) -> tuple[torch.Tensor, bool, tuple[list[str], torch.Tensor] | None]:
        """Next drafts [B, k] (-1 padded, at most ``k_step`` each) on the device; True when the proposer
        already applied this step's tokens to the host records (a host-side drafter, ``OnHost``); the shadow
        drafts asked for (``so.shadow_req_ids``, core/shadow.py): their request ids and [S, k] drafts, made
        but not verified. ``kv_pass``: a drafter with its own KV runs even when it drafts nothing (prompt
        chunks)."""
        assert self.proposer is not None
        plans = step.sampling
        with self.tracer.span("propose", track="device", step=so.step_id, reqs=len(plans), k=k_step):
            slots = torch.tensor([p.slot for p in plans], dtype=torch.int64, device=self.device)
            if k_step == 0 and not kv_pass:
                drafts = torch.full((len(plans), self.k), -1, dtype=torch.int64, device=self.device)
                self.batch.set_drafts(slots, drafts)  # no drafts this time; a drafter's KV catches up later
                shadow, applied = None, False
                asked = [i for i, p in enumerate(plans) if p.req_id in so.shadow_req_ids]
                if asked and so.num_shadow_drafts:
                    with self.tracer.span("shadow", track="device", step=so.step_id, reqs=len(asked)):
                        sub = [plans[i] for i in asked]
                        pick = torch.tensor(asked, dtype=torch.int64, device=self.device)
                        inp = self._propose_input(so.step_id, step, sub, slots.index_select(0, pick),
                                                  sampled.index_select(0, pick), fwd, so.num_shadow_drafts)
                        made = self.proposer.propose(inp)
                        assert isinstance(made, torch.Tensor)
                        shadow, applied = ([p.req_id for p in sub], made), inp.tokens_applied
                    if applied:  # a host-side drafter applied the shadowed requests' tokens: the others' below
                        rest = [i for i, p in enumerate(plans) if p.req_id not in so.shadow_req_ids]
                        plans = [plans[i] for i in rest]
                        sampled = sampled.index_select(0, torch.tensor(rest, dtype=torch.int64, device=self.device))
                if not applied and not self.proposer.follows_every_step:
                    return drafts, False, shadow
                # The (other) tokens applied to the host records now; a host-side index follows every committed
                # token (suffix decoding).
                self._apply_tokens(plans, committed_tokens(sampled))
                if self.proposer.follows_every_step:
                    self.proposer.follow([p.state for p in plans])
                return drafts, True, shadow
            inp = self._propose_input(so.step_id, step, plans, slots, sampled, fwd, k_step)
            drafts = self.proposer.propose(inp)
            assert isinstance(drafts, torch.Tensor)
            self.batch.set_drafts(slots, drafts)
        return drafts, inp.tokens_applied, None

    def _propose_input(self, step_id: int, step: StepInputs, plans: list[RequestPlan], slots: torch.Tensor,
                       sampled: torch.Tensor, fwd: object, k_step: int) -> ProposeInput:
        """What the proposer reads for ``plans`` (sampling requests of ``step`` in ``slots``), at most
        ``k_step`` drafts each."""
        assert self.proposer is not None
        # Exact per-request draft cap on the device: never past max_tokens, max_model_len or ``k_step``.
        n_tokens = self.batch.num_tokens.index_select(0, slots)
        prompt = torch.tensor([p.state.num_prompt_tokens for p in plans], device=self.device)
        max_tok = torch.tensor([p.state.sampling_params.max_tokens or UNBOUNDED for p in plans],
                               device=self.device)
        left = remaining_tokens(n_tokens, prompt, max_tok, self.max_model_len, minimum=torch.minimum)
        max_drafts = (left - 1).clamp(min=0, max=k_step)
        hidden = {-1: fwd.hidden_states}  # type: ignore[attr-defined]
        for layer, h in zip(self.proposer.aux_hidden_layers, fwd.aux_hidden_states):  # type: ignore[attr-defined]
            hidden[layer] = h
        return ProposeInput(
            states=[p.state for p in plans],
            slots=slots,
            input_batch=self.batch,
            sampled=sampled,
            max_drafts=max_drafts,
            num_drafts=k_step,
            batch=step.batch,
            hidden_states=hidden,
            sample_rows=[p.sample_rows for p in plans],
            prefill_states=[p.state for p in step.plans if not p.samples],
            step_id=step_id,
            apply_tokens=lambda lists: self._apply_tokens(plans, lists),
        )
