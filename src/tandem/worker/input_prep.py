"""Turn a ``SchedulerOutput`` into one flat ``ForwardBatch``, reading step-dependent values from the
persistent input batch on the device (``InputBatch``), never from a host copy of the previous step's results.

Per scheduled request (batch order = the scheduler's order) with n tokens of which k are draft slots:
- positions start at the request's true frontier on the device (``InputBatch.num_computed``), which the
  previous step advanced by its *accepted* count: this is where positions, slot mapping and sequence
  lengths are corrected for rejected drafts;
- the n - k known tokens are gathered from the device token history (the previous step appended its
  sampled token there); the k draft slots are gathered from the device drafts (sync scheduling writes
  the host's draft ids there first). A slot with no draft is fed token 0 and rejected by construction:
  ``-1`` never reaches the embedding. On the CPU a placeholder slot the proposer left empty is not fed at
  all (``_filled_slots``): the request's rows are its known tokens and its filled slots;
- a request samples when the scheduler says so (``SchedulerOutput.sampling_req_ids``); its logits rows
  are its last known token's row plus one row per draft slot.
The host knows every shape (query lengths come from the scheduler). Sequence lengths are exact on the
host unless the request's previous step is not reconciled yet; then the host carries an upper bound
(the scheduler's logical frontier) and the exact lengths travel as a device tensor.

Draft trees (``tree_nodes`` > 0): a tree verify (``SchedulerOutput.tree_req_ids``) feeds the root and every node
of the request's tree (``InputBatch.drafts`` / ``tree_depths`` / ``tree_bits``, written by the proposer; a chain
is stored the same way and feeds its k slots): node j's row is written at
key ``frontier + 1 + j`` and rotated at ``frontier + depth``, and sees what its bits in ``tree_masks`` allow
(every other row of the batch: causal, all bits). Nodes deeper than k are there but cannot be accepted.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from tandem.core.interface import SchedulerOutput
from tandem.model.forward_batch import ForwardBatch
from tandem.worker.input_batch import InputBatch
from tandem.worker.request_state import RequestState


@dataclass(slots=True)
class RequestPlan:
    state: RequestState
    req_id: str
    slot: int
    row_start: int  # first row of this request in the flat batch
    num_tokens: int  # rows in the batch (n)
    num_slots: int  # draft slots among them (k_r)
    num_known: int  # num_tokens - num_slots: tokens whose ids are known (history, not drafts)
    samples: bool
    exact: bool  # the host knows this request's frontier (its previous step is reconciled)
    host_drafts: list[int] | None  # sync scheduling: the drafts the host sent
    sample_rows: list[int] = field(default_factory=list)  # rows whose logits sample (last known + one per slot)
    prompt_logprob_rows: list[int] = field(default_factory=list)
    prompt_logprob_start: int = 0  # prompt position of the first prompt-logprob row
    tree: bool = False  # a tree verify: its rows are the root and every node of its tree


@dataclass(slots=True)
class StepInputs:
    batch: ForwardBatch
    plans: list[RequestPlan]
    logits_rows: list[int]  # rows of hidden states to project, in order
    row_to_logit: dict[int, int]  # flat row -> index into the logits matrix
    base: torch.Tensor  # [R] device: each request's frontier before the step
    sampling: list[RequestPlan]  # the plans that sample, in batch order
    sampling_index: list[int]  # their indices in ``plans``
    any_prompt_logprobs: bool  # some plan has prompt-logprob rows


def prepare_inputs(
    so: SchedulerOutput,
    ib: InputBatch,
    *,
    block_size: int,
    stale: set[str],
    device: torch.device,
    tree_nodes: int = 0,
) -> StepInputs:
    logical = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs} if stale else {}
    if stale:
        cached = so.scheduled_cached_reqs
        logical.update(zip(cached.req_ids, cached.num_computed_tokens))
    spec = so.scheduled_spec_decode_tokens
    sampling_ids = so.sampling_req_ids
    # Every request one known token (plain decode): row i is request i, at its frontier.
    decode_only = so.total_num_scheduled_tokens == len(so.num_scheduled_tokens) and not spec
    filled = _filled_slots(so, ib, device) if spec and not tree_nodes else {}
    plans: list[RequestPlan] = []
    seq_lens, logits_rows, slots, n_list = [], [], [], []
    row_slot, row_offset, row_draft = [], [], []  # per row: slot, offset in request, draft index or -1
    any_plp = False
    row = 0
    for rid, n in so.num_scheduled_tokens.items():
        st = ib.reqs[rid]
        slot = st.slot
        host_slots = spec.get(rid) if spec else None
        k = len(host_slots) if host_slots else 0
        exact = rid not in stale
        host_drafts = list(host_slots) if k and host_slots[0] != -1 else None  # type: ignore[index]
        known = n - k
        if rid in filled:  # placeholder slots the proposer left empty: no rows (see _filled_slots)
            k = filled[rid]
        rows = known + tree_nodes if rid in so.tree_req_ids else known + k  # a tree verify: the root and every node
        start_ub = st.num_computed_tokens if exact else logical.get(rid, st.num_computed_tokens)
        if exact and start_ub + known > len(st.prompt_token_ids) + len(st.output_token_ids):
            raise RuntimeError(
                f"{rid}: {known} tokens scheduled from position {start_ub} but only "
                f"{st.num_tokens} are known to the runner"
            )
        if not decode_only:
            row_slot += [slot] * rows
            row_offset += range(rows)
            row_draft += [-1] * known + list(range(rows - known))
        samples = rid in sampling_ids
        if samples:
            sample_rows = list(range(row + known - 1, row + rows))
        elif k:
            raise RuntimeError(f"{rid}: draft slots scheduled on a step that does not sample")
        else:
            sample_rows = []
        plan = RequestPlan(st, rid, slot, row, rows, k, known, samples, exact, host_drafts, sample_rows, [],
                           tree=rid in so.tree_req_ids)
        if st.sampling_params.prompt_logprobs is not None and exact:
            # Row at position p predicts prompt token p + 1 (prefill chunks are always host-exact).
            last = min(start_ub + known, st.num_prompt_tokens - 1)
            first = max(start_ub, st.prompt_logprobs_done)
            plan.prompt_logprob_rows = [row + p - start_ub for p in range(first, last)]
            plan.prompt_logprob_start = first
            if plan.prompt_logprob_rows:
                any_plp = True
                logits_rows.extend(plan.prompt_logprob_rows)
                sample_rows = [r for r in sample_rows if r not in plan.prompt_logprob_rows]
        plans.append(plan)
        slots.append(slot)
        n_list.append(rows)
        row += rows
        seq_lens.append(start_ub + rows)
        logits_rows.extend(sample_rows)

    i64 = {"dtype": torch.int64, "device": device}
    # Sync scheduling: the host's drafts are authoritative; put them where the gather reads drafts.
    for p in plans:
        if p.host_drafts is not None:
            ib.drafts[p.slot, : p.num_slots] = torch.tensor(p.host_drafts, **i64)
            ib.drafts[p.slot, p.num_slots :] = -1
    slots_t = torch.tensor(slots, **i64)
    base = ib.num_computed.index_select(0, slots_t)
    tree_masks = None
    if decode_only:
        row_slot_t, positions = slots_t, base
        ids = ib.tokens[slots_t, positions.clamp(max=ib.trash)]
        keys = positions
    else:
        row_slot_t, row_offset_t, row_draft_t = torch.tensor([row_slot, row_offset, row_draft], **i64)
        req_of_row = torch.repeat_interleave(torch.arange(len(plans), device=device), torch.tensor(n_list, **i64))
        keys = base.index_select(0, req_of_row) + row_offset_t  # where each row's K/V is written
        positions = keys
        history = ib.tokens[row_slot_t, keys.clamp(max=ib.trash)]
        draft_col = row_draft_t.clamp(min=0)
        drafts = ib.drafts[row_slot_t, draft_col]
        ids = torch.where(row_draft_t >= 0, drafts, history)
        if so.tree_req_ids:  # node j (draft row j) rotates at its depth: key - (j + 1) + depth
            is_node = row_draft_t >= 0
            positions = keys + torch.where(is_node, ib.tree_depths[row_slot_t, draft_col] - draft_col - 1, 0)
            tree_masks = torch.where(is_node, ib.tree_bits[row_slot_t, draft_col + 1], -1)
    ids = ids.clamp(min=0)
    block_col = torch.div(keys, block_size, rounding_mode="floor")
    slot_in_block = keys % block_size
    slot_mapping = ib.block_table[row_slot_t, block_col] * block_size + slot_in_block
    width = -(-max(seq_lens) // block_size)
    every_row = logits_rows == list(range(row))  # plain decode: project every hidden row, in order
    batch = ForwardBatch(
        input_ids=ids,
        positions=positions,
        slot_mapping=slot_mapping,
        group_block_tables=[t[:, :width].index_select(0, slots_t) for t in ib.group_block_tables],
        group_slot_mappings=[t[row_slot_t, block_col] * block_size + slot_in_block for t in ib.group_block_tables],
        block_tables=ib.block_table[:, :width].index_select(0, slots_t),  # (only the columns in use copied)
        query_start_loc=list(itertools.accumulate(n_list, initial=0)),
        seq_lens=seq_lens,
        logits_indices=None if every_row or not logits_rows else torch.tensor(logits_rows, **i64),
        seq_lens_dev=None if all(p.exact for p in plans) else base + torch.tensor(n_list, **i64),
        tree_masks=tree_masks,
    )
    row_to_logit = {r: i for i, r in enumerate(logits_rows)}
    sampling_index = [i for i, p in enumerate(plans) if p.samples]
    return StepInputs(batch, plans, logits_rows, row_to_logit, base, [plans[i] for i in sampling_index],
                      sampling_index, any_plp)


def _filled_slots(so: SchedulerOutput, ib: InputBatch, device: torch.device) -> dict[str, int]:
    """Per request whose draft slots are placeholders (async scheduling: the drafts were made during the step
    before, after this step was scheduled), how many of them hold a draft — the valid prefix of its drafts,
    as the verify reads it (``ModelRunner._sample``). The proposer leaves a slot empty where it found nothing
    to draft (prompt lookup without a match, a suffix below its score), and an empty slot would be fed token 0
    and rejected by construction: a logits row through every layer for nothing. So those rows are not fed:
    the request verifies its filled slots, the scheduler rolls its frontier back by every slot it scheduled
    and did not get accepted, as for a rejected one (outputs are the same by construction; a synchronous
    step schedules only real drafts in the first place). Only where the drafts are readable without waiting on
    the device (a CPU batch; the worker thread wrote them in the step before); chains only (the caller skips
    batches with trees: a tree verify's rows are its tree's)."""
    if device.type != "cpu":
        return {}
    asked = [(rid, ib.reqs[rid].slot, len(slots)) for rid, slots in so.scheduled_spec_decode_tokens.items()
             if slots and slots[0] == -1]
    if not asked:
        return {}
    width = max(k for _, _, k in asked)
    idx = torch.tensor([slot for _, slot, _ in asked], dtype=torch.int64)
    valid = (ib.drafts.index_select(0, idx)[:, :width] >= 0).cumprod(dim=1).sum(dim=1).tolist()
    return {rid: min(k, v) for (rid, _, k), v in zip(asked, valid)}
