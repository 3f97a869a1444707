"""Turn a ``SchedulerOutput`` plus the runner's own request states into one flat ``ForwardBatch``.

Per scheduled request (batch order = the scheduler's order) with n tokens of which k are draft slots:
- positions start at the runner's *true* frontier (``RequestState.num_computed_tokens``), which already
  reflects the accepted counts of every earlier step: this is where async scheduling's positions and slot
  mapping are corrected for rejected drafts, with no wait on the host;
- the n - k known tokens come from the runner's token list (it appended step N's sampled token itself);
- draft slots hold the host's ids (sync) or, for ``-1`` slots (async), the drafts the runner proposed and
  kept. A slot with no usable draft is fed token 0 and marked invalid: ``-1`` never reaches the embedding.
- a request *samples* when its known tokens are all fed; its logits rows are the last known token's row
  plus one row per valid draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tandem.core.interface import SchedulerOutput
from tandem.model.forward_batch import ForwardBatch
from tandem.worker.request_state import RequestState


@dataclass
class RequestPlan:
    state: RequestState
    row_start: int  # first row of this request in the flat batch
    num_tokens: int  # rows in the batch (n)
    start_pos: int  # position of the first row
    drafts: list[int]  # len = num_slots; -1 marks an invalid slot
    num_valid: int  # leading valid drafts (the rest of the slots are rejected by construction)
    samples: bool
    # Rows of the flat batch whose logits are computed for this request, and their meaning.
    sample_rows: list[int] = field(default_factory=list)
    prompt_logprob_rows: list[int] = field(default_factory=list)

    @property
    def num_slots(self) -> int:
        return len(self.drafts)


@dataclass
class StepInputs:
    batch: ForwardBatch
    plans: list[RequestPlan]
    logits_rows: list[int]  # rows of hidden states to project, in order
    row_to_logit: dict[int, int]  # flat row -> index into the logits matrix

    @property
    def any_valid_drafts(self) -> bool:
        return any(p.num_valid for p in self.plans if p.samples)


def prepare_inputs(
    so: SchedulerOutput,
    states: dict[str, RequestState],
    *,
    block_size: int,
    max_model_len: int,
    num_spec_tokens: int,
    device: torch.device,
) -> StepInputs:
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    plans: list[RequestPlan] = []
    logits_rows: list[int] = []

    for rid, n in so.num_scheduled_tokens.items():
        st = states[rid]
        host_slots = so.scheduled_spec_decode_tokens.get(rid, [])
        k = len(host_slots)
        if k and host_slots[0] != -1:
            drafts = list(host_slots)  # sync scheduling: the host's ids are authoritative
        else:
            drafts = (st.drafts[:k] + [-1] * k)[:k]  # async: the drafts this runner kept
        num_valid = 0
        while num_valid < k and drafts[num_valid] >= 0:
            num_valid += 1
        num_valid = min(num_valid, st.max_drafts(num_spec_tokens, max_model_len))
        drafts = drafts[:num_valid] + [-1] * (k - num_valid)

        non_spec = n - k
        start = st.num_computed_tokens
        if start + non_spec > st.num_tokens:
            raise RuntimeError(
                f"{rid}: {non_spec} tokens scheduled from position {start} but only "
                f"{st.num_tokens} are known to the runner"
            )
        if start + n > max_model_len:
            raise RuntimeError(f"{rid}: positions up to {start + n - 1} reach past max_model_len")
        if start + n > len(st.block_ids) * block_size:
            raise RuntimeError(f"{rid}: {len(st.block_ids)} blocks cannot hold {start + n} tokens")
        row0 = len(ids)
        ids.extend(st.tokens(start, start + non_spec))
        ids.extend(d if d >= 0 else 0 for d in drafts)
        for p in range(start, start + n):
            positions.append(p)
            slots.append(st.block_ids[p // block_size] * block_size + p % block_size)
        qsl.append(len(ids))
        seq_lens.append(start + n)
        tables.append(st.block_ids)

        samples = start + non_spec == st.num_tokens
        plan = RequestPlan(st, row0, n, start, drafts, num_valid, samples)
        if samples:
            plan.sample_rows = list(range(row0 + non_spec - 1, row0 + non_spec + num_valid))
        if st.sampling_params.prompt_logprobs is not None:
            # Row at position p predicts prompt token p + 1.
            last = min(start + non_spec, st.num_prompt_tokens - 1)
            first = max(start, st.prompt_logprobs_done)
            plan.prompt_logprob_rows = [row0 + p - start for p in range(first, last)]
        plans.append(plan)
        logits_rows.extend(plan.prompt_logprob_rows)
        logits_rows.extend(r for r in plan.sample_rows if r not in plan.prompt_logprob_rows)

    width = max(len(t) for t in tables)
    table = [t + [0] * (width - len(t)) for t in tables]

    def tensor(x: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64).to(device, non_blocking=True)

    row_to_logit = {r: i for i, r in enumerate(logits_rows)}
    batch = ForwardBatch(
        input_ids=tensor(ids),
        positions=tensor(positions),
        slot_mapping=tensor(slots),
        block_tables=tensor(table),
        query_start_loc=qsl,
        seq_lens=seq_lens,
        logits_indices=tensor(logits_rows) if logits_rows else None,
    )
    return StepInputs(batch, plans, logits_rows, row_to_logit)
