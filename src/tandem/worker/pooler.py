"""The pooling runner's one extra step (``runner="pooling"``): each request's prompt, through the same paged
model, pooled from the final (normed) hidden states — ``LAST``: the last prompt position's; ``MEAN``: the mean
over every prompt position, summed chunk by chunk across a chunked prefill — then L2-normalized unless
``normalize`` is off. The vector is ready in the step where the prompt ends (the step that samples the request's
one token), and travels with that step's output."""

from __future__ import annotations

import torch

from tandem.worker.input_prep import RequestPlan


class Pooler:
    def __init__(self, pooling_type: str, normalize: bool) -> None:
        if pooling_type not in ("LAST", "MEAN"):
            raise ValueError(f"pooling_type must be LAST or MEAN, got {pooling_type!r}")
        self.pooling_type = pooling_type
        self.normalize = normalize

    def __call__(self, plans: list[RequestPlan], hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """``hidden``: [T, H] of the step's flat batch. Returns req_id -> [H] for the prompts that ended."""
        out: dict[str, torch.Tensor] = {}
        for p in plans:
            st = p.state
            rows = hidden[p.row_start : p.row_start + p.num_known].float()
            if self.pooling_type == "MEAN":
                part = rows.sum(dim=0)
                st.pool_sum = part if st.pool_sum is None else st.pool_sum + part
                st.pool_count += rows.shape[0]
            if not p.samples:
                continue
            if self.pooling_type == "MEAN":
                assert st.pool_sum is not None
                vec = st.pool_sum / st.pool_count
            else:
                vec = rows[-1]
            out[st.req_id] = torch.nn.functional.normalize(vec, dim=-1) if self.normalize else vec
        return out
