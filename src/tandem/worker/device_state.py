"""The runner's per-request state on the device: token history, frontier, drafts, block table.

Every running request owns one row (a *slot*). Step N writes its sampled tokens, advances the frontier by
the accepted count and stores the next drafts here with device ops only; step N+1 reads its input ids,
positions and slot mapping from here. So the next step never needs the host to know what step N accepted:
that is what lets the worker launch step N+1 before reconciling step N on the host (deferred
reconciliation), and what keeps ``-1`` placeholders away from the embedding.

Invariants (host view, checked in tests): a slot's ``num_tokens`` counts prompt + committed outputs as the
runner sampled them; ``num_computed <= num_tokens - 1`` once the prompt is done; tokens past ``num_tokens``
and drafts past the valid ones are garbage / -1 and never read as inputs.
"""

from __future__ import annotations

import torch


class DeviceState:
    def __init__(
        self, max_reqs: int, max_model_len: int, max_blocks: int, k: int, device: torch.device,
        num_groups: int = 1,
    ) -> None:
        self.device = device
        self.width = max_model_len + k + 2  # room for a verify's k + 1 tokens; last column = trash
        self.trash = self.width - 1
        self.tokens = torch.zeros(max_reqs, self.width, dtype=torch.int64, device=device)
        self.num_tokens = torch.zeros(max_reqs, dtype=torch.int64, device=device)
        self.num_computed = torch.zeros(max_reqs, dtype=torch.int64, device=device)
        self.drafts = torch.full((max_reqs, max(k, 1)), -1, dtype=torch.int64, device=device)
        self.block_table = torch.zeros(max_reqs, max_blocks, dtype=torch.int64, device=device)
        # KV cache groups 1.. of a sliding-window model: one more table each (core/kv_cache_manager.py).
        self.group_block_tables = [torch.zeros_like(self.block_table) for _ in range(num_groups - 1)]
        self.max_model_len = max_model_len
        self._free = list(range(max_reqs - 1, -1, -1))
        self.slot_of: dict[str, int] = {}

    # -- slots -------------------------------------------------------------------------------------------
    def add(self, req_id: str, tokens: list[int], num_computed: int, block_ids: list[int],
            group_block_ids: list[list[int]] | None = None) -> int:
        if not self._free:
            raise RuntimeError("device state is full: more live requests than max_num_seqs allows")
        if len(tokens) > self.max_model_len:
            raise RuntimeError(f"{req_id}: {len(tokens)} tokens exceed max_model_len")
        slot = self._free.pop()
        self.slot_of[req_id] = slot
        n = len(tokens)
        self.tokens[slot, :n] = torch.tensor(tokens, dtype=torch.int64).to(self.device, non_blocking=True)
        self.num_tokens[slot] = n
        self.num_computed[slot] = num_computed
        self.drafts[slot] = -1
        self.set_blocks(slot, 0, block_ids)
        for g, ids in enumerate(group_block_ids or []):
            self.set_blocks(slot, 0, ids, group=g + 1)
        return slot

    def remove(self, req_id: str) -> None:
        slot = self.slot_of.pop(req_id, None)
        if slot is not None:
            self._free.append(slot)

    def set_blocks(self, slot: int, start: int, block_ids: list[int], group: int = 0) -> None:
        if not block_ids:
            return
        table = self.block_table if group == 0 else self.group_block_tables[group - 1]
        if start + len(block_ids) > table.shape[1]:
            raise RuntimeError("block table row overflow")
        ids = torch.tensor(block_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        table[slot, start : start + len(block_ids)] = ids

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
