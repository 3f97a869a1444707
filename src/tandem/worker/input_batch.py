"""The worker's persistent batch: one slot per running request, holding its token history, frontier, drafts
and block tables on the device, its sampling parameters as columns (``SamplingColumns``) and its host record
(``RequestState``). A slot is written when a request is admitted (validated then, once), grows when the
scheduler gives it blocks, and is freed when the request finishes or is preempted; nothing is rebuilt per step.

Step N writes its sampled tokens, advances the frontier by the accepted count and stores the next drafts here
with device ops only; step N+1 reads its input ids, positions and slot mapping from here. So the next step never needs the host to know what step N accepted:
that is what lets the worker launch step N+1 before reconciling step N on the host (deferred
reconciliation), and what keeps ``-1`` placeholders away from the embedding.

Invariants (host view, checked in tests): a slot's ``num_tokens`` counts prompt + committed outputs as the
runner sampled them; ``num_computed <= num_tokens - 1`` once the prompt is done; tokens past ``num_tokens``
and drafts past the valid ones are garbage / -1 and never read as inputs.
"""

from __future__ import annotations


import torch

from tandem.core.interface import CachedRequestData, NewRequestData
from tandem.worker.request_state import RequestState
from tandem.worker.sampling_columns import SamplingColumns


class InputBatch:
    def __init__(
        self, max_reqs: int, max_model_len: int, max_blocks: int, k: int, device: torch.device, *,
        vocab_size: int, num_groups: int = 1, tree_nodes: int = 0,
    ) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.width = max_model_len + k + 2  # room for a verify's k + 1 tokens; last column = trash
        self.trash = self.width - 1
        self.tokens = torch.zeros(max_reqs, self.width, dtype=torch.int64, device=device)
        self.num_tokens = torch.zeros(max_reqs, dtype=torch.int64, device=device)
        self.num_computed = torch.zeros(max_reqs, dtype=torch.int64, device=device)
        self.drafts = torch.full((max_reqs, max(k, tree_nodes, 1)), -1, dtype=torch.int64, device=device)
        # Draft trees (worker/tree_step.py): each slot's next tree — nodes' parents (0: the root) and depths, and
        # the attention bits of the root and every node; its tokens are the slot's drafts.
        n = max(tree_nodes, 1)
        self.tree_parents = torch.zeros(max_reqs, n, dtype=torch.int64, device=device)
        self.tree_depths = torch.ones(max_reqs, n, dtype=torch.int64, device=device)
        self.tree_bits = torch.full((max_reqs, n + 1), -1, dtype=torch.int64, device=device)
        self.block_table = torch.zeros(max_reqs, max_blocks, dtype=torch.int64, device=device)
        # KV cache groups 1.. of a sliding-window model: one more table each (core/kv_cache_manager.py).
        self.group_block_tables = [torch.zeros_like(self.block_table) for _ in range(num_groups - 1)]
        self.max_model_len = max_model_len
        self.sampling = SamplingColumns(max_reqs, vocab_size, device)
        self.reqs: dict[str, RequestState] = {}  # the host records (each knows its slot), by request id
        self._free = list(range(max_reqs - 1, -1, -1))

    # -- slots -------------------------------------------------------------------------------------------
    def add(self, nr: NewRequestData) -> RequestState:
        """Admit a request (new, or resumed after preemption): its slot, history, blocks and sampling columns.
        Its parameters are checked against the vocabulary here, once, not at every step."""
        if not self._free:
            raise RuntimeError("input batch is full: more live requests than max_num_seqs allows")
        n = len(nr.prompt_token_ids) + len(nr.output_token_ids)
        if n > self.max_model_len:
            raise RuntimeError(f"{nr.req_id}: {n} tokens exceed max_model_len")
        nr.sampling_params.check_vocab(self.vocab_size)
        slot = self._free.pop()
        st = RequestState.from_new(nr, slot)
        self.reqs[nr.req_id] = st
        tokens = st.prompt_token_ids + st.output_token_ids
        self.tokens[slot, :n] = torch.tensor(tokens, dtype=torch.int64).to(self.device, non_blocking=True)
        self.num_tokens[slot] = n
        self.num_computed[slot] = nr.num_computed_tokens
        self.drafts[slot] = -1
        self.sampling.set(slot, nr.sampling_params, nr.seed)
        self._write_blocks([(slot, 0, st.block_ids)], [[(slot, 0, ids)] for ids in st.group_block_ids])
        return st

    def remove(self, req_id: str) -> None:
        st = self.reqs.pop(req_id, None)
        if st is not None:
            self._free.append(st.slot)

    def append_blocks(self, cached: CachedRequestData) -> None:
        """The blocks the scheduler gave running requests this step, written in one go per table."""
        main: list[tuple[int, int, list[int]]] = []
        groups: list[list[tuple[int, int, list[int]]]] = [[] for _ in self.group_block_tables]
        columns = zip(cached.req_ids, cached.new_block_ids, cached.new_group_block_ids)
        for rid, new_blocks, new_group_blocks in columns:
            if not new_blocks and not new_group_blocks:
                continue  # most steps: the request's blocks already cover its new tokens
            st = self.reqs[rid]
            if new_blocks:
                main.append((st.slot, len(st.block_ids), new_blocks))
                st.block_ids.extend(new_blocks)
            for g, new in enumerate(new_group_blocks):
                if g == len(st.group_block_ids):
                    st.group_block_ids.append([])
                if new:
                    groups[g].append((st.slot, len(st.group_block_ids[g]), new))
                    st.group_block_ids[g].extend(new)
        if main or any(groups):
            self._write_blocks(main, groups)

    def _write_blocks(
        self, main: list[tuple[int, int, list[int]]], groups: list[list[tuple[int, int, list[int]]]]
    ) -> None:
        for table, items in zip([self.block_table, *self.group_block_tables], [main, *groups]):
            if not items:
                continue
            rows = [slot for slot, _, ids in items for _ in ids]
            cols = [start + j for _, start, ids in items for j in range(len(ids))]
            if max(cols) >= table.shape[1]:
                raise RuntimeError("block table row overflow")
            vals = [b for _, _, ids in items for b in ids]
            idx = torch.tensor([rows, cols, vals], dtype=torch.int64).to(self.device, non_blocking=True)
            table.index_put_((idx[0], idx[1]), idx[2])

    # -- after a step (device ops only) --------------------------------------------------------------------
    def commit(
        self,
        slots: torch.Tensor,  # [B] slots of the requests that sampled
        sampled: torch.Tensor,  # [B, K+1] accepted drafts + one token, -1 padded
        new_computed: torch.Tensor,  # [B] true frontier after the step
    ) -> torch.Tensor:
        """Append each request's sampled tokens to its history; returns the per-request token count."""
        counts = (sampled >= 0).sum(dim=1)
        cols = self.num_tokens[slots].unsqueeze(1) + torch.arange(sampled.shape[1], device=self.device)
        keep = sampled >= 0
        cols = torch.where(keep, cols.clamp(max=self.trash), torch.full_like(cols, self.trash))
        rows = slots.unsqueeze(1).expand_as(cols)
        self.tokens.index_put_((rows, cols), torch.where(keep, sampled, torch.zeros_like(sampled)))
        self.num_tokens[slots] += counts
        self.num_computed[slots] = new_computed
        return counts

    def set_drafts(self, slots: torch.Tensor, drafts: torch.Tensor) -> None:
        """``drafts`` [B, k] with -1 where a request has no draft at that position."""
        self.drafts[slots] = -1
        if drafts.numel():
            self.drafts[slots, : drafts.shape[1]] = drafts
