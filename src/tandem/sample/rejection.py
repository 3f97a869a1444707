"""Exact speculative verification: the rejection sampler of Leviathan et al. (2023) and
Chen et al. (2023).

Names follow the papers: ``p`` is the target distribution, ``q`` the draft distribution, ``d`` the
draft tokens. For one request with drafts d_1..d_k and target distributions p_1..p_{k+1} (p_i's
context holds d_1..d_{i-1}):

- greedy: accept d_i while d_i == argmax p_i; at the first mismatch emit argmax p_i (the *recovered*
  token); when every draft is accepted emit argmax p_{k+1} (the *bonus* token);
- random: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection emit the
  recovered token drawn from normalise(max(p_i - q_i, 0)); when every draft is accepted draw the
  bonus token from p_{k+1}. Without draft probabilities, q_i is the one-hot on d_i (an n-gram
  proposer "samples" d_i with certainty), so d_i is accepted with probability p_i(d_i) and the
  recovered token comes from p_i with d_i removed.

Each emitted token then follows the target distribution exactly, whatever q is, provided each d_i
was drawn from q_i (or, without draft probabilities, chosen without looking at p).

Corner cases, decided here:

- p_i(d_i) = 0: never accepted (the target could not have produced it).
- q_i(d_i) = 0 with p_i(d_i) > 0: the drafter proposed a token it says it could not produce, so its
  q is not the distribution it sampled from and the ratio is meaningless; the draft is rejected and
  the recovered token is drawn from the residual as usual. This is conservative: it costs
  acceptance, never correctness of a token drawn from p (under a consistent q this event has
  probability zero).
- residual all zero (p_i <= q_i everywhere, i.e. p_i == q_i up to rounding; then acceptance was
  certain in exact arithmetic): the recovered token is drawn from p_i.
- ragged drafts: -1 marks "no draft"; only the prefix before the first -1 counts. A request with
  k_valid drafts emits between 1 and k_valid + 1 tokens; the bonus comes from p_{k_valid+1}. With no
  draft at all the output is one token from p_1, drawn exactly like
  :class:`~tandem.sample.sampler.Sampler` draws it.
- target rows must be normalised (the acceptance ratio needs true probabilities); the recovered /
  bonus draw uses an exponential race, which does not need normalising.

Randomness: per random row, ``V`` exponentials for the final token first, then ``K`` uniforms for
the acceptance tests, from that row's source (a generator or a native stream: ``rng.py`` documents
the keying and the order); rows without one share one batched draw. Greedy rows consume nothing that
matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple

import torch

from tandem.sample.argmax import argmax_last
from tandem.sample.metadata import SamplingMetadata, to_device
from tandem.sample.rng import RowRng, exponential_noise, race_sample, uniform_noise
from tandem.sample.sampler import LogprobsTensors, Sampler, compute_logprobs

PLACEHOLDER = -1


def rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generators: Sequence[RowRng | None] | None,
    greedy_mask: torch.Tensor,
) -> torch.Tensor:
    """Verify drafts against the target; returns ``[B, K+1]`` int64 output ids padded with -1.

    ``target_probs`` [B, K+1, V] (processed, normalised), ``draft_token_ids`` [B, K] int64 (-1
    suffix = no draft), ``draft_probs`` [B, K, V] or None (one-hot drafts), ``generators`` one per
    row or None (all from the default generator), ``greedy_mask`` [B] bool. Row b's output is its
    accepted drafts followed by one recovered or bonus token. Draft ids must be below V; that is not
    checked, as checking would synchronise with the device.
    """
    batch, k = _check(target_probs, draft_token_ids, draft_probs, generators, greedy_mask)
    index = torch.arange(batch * (k + 1), device=target_probs.device).view(batch, k + 1)
    return _rejection_sample(
        target_probs.reshape(batch * (k + 1), -1), index, draft_token_ids, draft_probs, generators,
        greedy_mask, any_random=True,
    )


def num_accepted(output_token_ids: torch.Tensor) -> torch.Tensor:
    """Accepted drafts per row [B] of a :func:`rejection_sample` output (emitted tokens - 1)."""
    return (output_token_ids != PLACEHOLDER).sum(dim=1) - 1


def greedy_verify(target_ids: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
    """The greedy rule on token ids alone: ``target_ids`` [B, K+1] = argmax p_i per position,
    ``draft_token_ids`` [B, K] (-1 suffix = no draft); returns ``[B, K+1]`` like :func:`rejection_sample`
    with one-hot ``p`` on ``target_ids`` (the distribution of a greedy row), without building ``p``."""
    batch, k = draft_token_ids.shape
    if tuple(target_ids.shape) != (batch, k + 1):
        raise ValueError(f"target_ids must be [{batch}, {k + 1}], got {tuple(target_ids.shape)}")
    valid = (draft_token_ids >= 0).to(torch.int64).cumprod(dim=1).bool()
    accepted = (valid & (draft_token_ids == target_ids[:, :k])).to(torch.int64).cumprod(dim=1).bool()
    n_accepted = accepted.sum(dim=1)
    rows = torch.arange(batch, device=target_ids.device)
    out = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int64, device=target_ids.device)
    out[:, :k] = torch.where(accepted, draft_token_ids, PLACEHOLDER)
    out[rows, n_accepted] = target_ids[rows, n_accepted]  # recovered at the first mismatch, else bonus
    return out


def greedy_verify_rows(
    target_ids: Sequence[int], draft_token_ids: Sequence[Sequence[int]], num_draft_tokens: Sequence[int], width: int
) -> list[list[int]]:
    """:func:`greedy_verify` on host lists, for a batch laid out as :class:`RejectionSampler` takes it:
    ``target_ids`` the argmax of every verify row, request b's ``num_draft_tokens[b] + 1`` rows one after
    another; ``draft_token_ids[b]`` its drafts (slots at or past ``num_draft_tokens[b]`` ignored, -1 = no
    draft, only the prefix before the first -1 counts). Returns ``width + 1`` ids a request, -1 padded.
    On the CPU a verify step's ids are a handful of numbers: this is what the greedy rule costs there
    instead of a dozen small tensor operations (the tensor rule is the reference; tested equal)."""
    out: list[list[int]] = []
    start = 0
    for drafts, n in zip(draft_token_ids, num_draft_tokens):
        a = 0
        while a < n and drafts[a] >= 0 and drafts[a] == target_ids[start + a]:
            a += 1
        out.append([*drafts[:a], target_ids[start + a], *[PLACEHOLDER] * (width - a)])
        start += n + 1
    return out


def rejection_sample_rows(
    p_rows: torch.Tensor,
    draft_token_ids: Sequence[Sequence[int]],
    num_draft_tokens: Sequence[int],
    width: int,
    generators: Sequence[RowRng | None],
    greedy: Sequence[bool],
) -> torch.Tensor:
    """The rule without draft probabilities (one-hot q), deciding on host lists: ``p_rows`` [R, V] the verify rows
    laid out as :func:`greedy_verify_rows` takes them, ``generators`` / ``greedy`` one per request. A CPU verify
    step's acceptance tests are a handful of numbers: the noise and the uniforms drawn (in the rule's order), the
    drafts' probabilities read in one gather, the tests in Python, then one race over each request's final row
    — ~8 tensor operations where the tensor rule (:func:`_rejection_sample`, the reference; tested equal, token
    for token) takes ~30. Returns ``[B, width + 1]`` ids, -1 padded."""
    batch, vocab = len(num_draft_tokens), p_rows.shape[1]
    starts = list(accumulate((n + 1 for n in num_draft_tokens), initial=0))[:-1]
    # a request's drafts: the prefix of its slots before the first -1
    valid = []
    for drafts, n in zip(draft_token_ids, num_draft_tokens):
        m = 0
        while m < n and drafts[m] >= 0:
            m += 1
        valid.append(m)
    noise = exponential_noise(batch, vocab, generators, p_rows.device)  # drawn first: see the module doc
    u = uniform_noise(batch, width, generators, p_rows.device).tolist()
    flat = [(starts[b] + j) * vocab + draft_token_ids[b][j] for b in range(batch) for j in range(valid[b])
            if not greedy[b]]
    p_d = iter(p_rows.reshape(-1).index_select(0, torch.tensor(flat)).tolist() if flat else [])
    top = argmax_last(p_rows).tolist() if any(greedy) else []
    accepted = []
    for b in range(batch):
        a = 0
        while a < valid[b]:
            d = draft_token_ids[b][a]
            if greedy[b]:
                ok = d == top[starts[b] + a]
            else:
                p = next(p_d)
                ok = p >= 1.0 or u[b][a] < p  # min(1, p / q) with q(d) = 1
            if not ok:
                break
            a += 1
        if not greedy[b]:
            for _ in range(a + 1, valid[b]):  # untested drafts' probabilities (read in the one gather)
                next(p_d)
        accepted.append(a)
    dist = p_rows.index_select(0, torch.tensor([starts[b] + a for b, a in enumerate(accepted)]))  # [B, V]
    rejected = [b for b, a in enumerate(accepted) if a < valid[b] and not greedy[b]]
    if rejected:  # the residual of a one-hot q: p without the rejected draft, unless nothing else is left
        rows = torch.tensor(rejected)
        cols = torch.tensor([draft_token_ids[b][accepted[b]] for b in rejected])
        p_df = dist[rows, cols]
        dist[rows, cols] = 0.0
        dist[rows, cols] = torch.where(dist[rows].sum(dim=1) > 0, 0.0, p_df)
    sampled = race_sample(dist, noise).tolist()
    return torch.tensor([[*draft_token_ids[b][:a], top[starts[b] + a] if greedy[b] else sampled[b],
                          *[PLACEHOLDER] * (width - a)] for b, a in enumerate(accepted)], dtype=torch.int64)


def _rejection_sample(
    p_rows: torch.Tensor,
    index: torch.Tensor,
    draft: torch.Tensor,
    q: torch.Tensor | None,
    generators: Sequence[RowRng | None] | None,
    greedy_mask: torch.Tensor,
    *,
    any_random: bool,
    any_greedy: bool = True,
) -> torch.Tensor:
    """The rule on ``p`` given as rows: p_i of request b is ``p_rows[index[b, i]]`` ([R, V] and [B, K+1]),
    so a batch whose requests verify different numbers of drafts is never padded to [B, K+1, V] — only
    the rows the rule reads are touched (argmax over the R rows, one row per request for the final draw).
    ``any_random`` / ``any_greedy``: whether ``greedy_mask`` has a False / a True (known on the host; the
    argmax is skipped where no row is greedy)."""
    batch, k = index.shape[0], index.shape[1] - 1
    vocab, device = p_rows.shape[1], p_rows.device
    # [B, K]: the prefix before the first -1 (anything after it is ignored)
    valid = (draft >= 0).to(torch.int64).cumprod(dim=1).bool()
    d = torch.where(valid, draft, 0)
    p_argmax = argmax_last(p_rows)[index] if any_greedy or not any_random else None  # [B, K+1]
    accept = valid & (d == p_argmax[:, :k]) if p_argmax is not None else valid  # the greedy rule
    if any_random:
        gens = list(generators) if generators is not None else [None] * batch
        noise = exponential_noise(batch, vocab, gens, device)  # drawn first: see the module doc
        u = uniform_noise(batch, k, gens, device)
        p_d = p_rows[index[:, :k], d]  # [B, K]
        q_d = torch.ones_like(p_d) if q is None else q.gather(2, d.unsqueeze(2)).squeeze(2)
        # accept with probability min(1, p/q), written without dividing; q(d) = 0 never accepts.
        accept_random = valid & (q_d > 0) & ((p_d >= q_d) | (u * q_d < p_d))
        accept = torch.where(greedy_mask.unsqueeze(1), accept, accept_random) if any_greedy else accept_random
    accepted = accept.to(torch.int64).cumprod(dim=1).bool()  # only a prefix of acceptances counts
    n_accepted = accepted.sum(dim=1)  # [B]; the final token goes to slot n_accepted
    rows = torch.arange(batch, device=device)
    # greedy: recovered at the first mismatch, else bonus
    final = p_argmax[rows, n_accepted] if p_argmax is not None else None
    if any_random:
        dist = p_rows[index[rows, n_accepted]]  # [B, V], a copy: bonus (all valid drafts accepted) as it is
        if k > 0:
            rejected = n_accepted < valid.sum(dim=1)
            slot = n_accepted.clamp_max(k - 1)
            if q is None:
                # The residual of a one-hot q: p with the rejected draft's entry zeroed (max(p(d) - 1, 0) = 0,
                # every other entry p - 0, the same floats), written into the row in place; where nothing else
                # is left (p was all on d) the entry stays and the draw is from p, as below.
                d_final = d[rows, slot]
                p_df = dist[rows, d_final]
                dist[rows, d_final] = torch.where(rejected, 0.0, p_df)
                dist[rows, d_final] = torch.where(rejected & (dist.sum(dim=1) > 0), 0.0, p_df)
            else:
                residual = (dist - q[rows, slot]).clamp_min(0.0)
                residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, dist)
                dist = torch.where(rejected.unsqueeze(1), residual, dist)
        sampled = race_sample(dist, noise)
        final = sampled if final is None else torch.where(greedy_mask, final, sampled)
    assert final is not None
    out = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int64, device=device)
    out[:, :k] = torch.where(accepted, d, PLACEHOLDER)
    out[rows, n_accepted] = final
    return out


def _check(
    p: torch.Tensor,
    draft: torch.Tensor,
    q: torch.Tensor | None,
    generators: Sequence[RowRng | None] | None,
    greedy_mask: torch.Tensor,
) -> tuple[int, int]:
    if p.dim() != 3:
        raise ValueError(f"target_probs must be [B, K+1, V], got shape {tuple(p.shape)}")
    batch, k = p.shape[0], p.shape[1] - 1
    if k < 0:
        raise ValueError("target_probs needs at least one position")
    if tuple(draft.shape) != (batch, k) or draft.dtype != torch.int64:
        raise ValueError(
            f"draft_token_ids must be int64 of shape ({batch}, {k}), "
            f"got {draft.dtype} {tuple(draft.shape)}"
        )
    if q is not None and tuple(q.shape) != (batch, k, p.shape[2]):
        raise ValueError(
            f"draft_probs must have shape ({batch}, {k}, {p.shape[2]}), got {tuple(q.shape)}"
        )
    if generators is not None and len(generators) != batch:
        raise ValueError(f"generators: expected {batch} entries, got {len(generators)}")
    if tuple(greedy_mask.shape) != (batch,) or greedy_mask.dtype != torch.bool:
        raise ValueError(f"greedy_mask must be bool of shape ({batch},)")
    return batch, k


class RejectionOutput(NamedTuple):
    output_token_ids: torch.Tensor  # [B, K+1] int64, -1 padded
    # Raw logprobs per verify row (the rows of the logits): row start_b + j describes
    # output_token_ids[b, j]; rows past a request's emitted tokens describe padding and are to be
    # ignored.
    logprobs: LogprobsTensors | None


class RejectionSampler:
    """Glue from verify-row logits to :func:`rejection_sample`.

    Request b owns ``num_draft_tokens[b] + 1`` consecutive rows of ``logits`` and of the metadata
    (built with one :class:`~tandem.sample.metadata.RowSpec` per verify row). Its target
    distributions come from :meth:`Sampler.compute_probs`, its greedy flag from its first row, and
    its random numbers the position-keyed source of its first verify row (seed, position of the
    first token it can emit).
    """

    def __init__(self, sampler: Sampler | None = None) -> None:
        self.sampler = sampler if sampler is not None else Sampler()

    def forward(
        self,
        logits: torch.Tensor,
        meta: SamplingMetadata,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: Sequence[int],
        draft_probs: torch.Tensor | None = None,
    ) -> RejectionOutput:
        """``logits`` [R, V] with R = sum(k_b + 1); ``draft_token_ids`` [B, K] with K >= max k_b
        (slots at or past k_b are ignored); ``draft_probs`` [B, K, V] or None."""
        batch = len(num_draft_tokens)
        if draft_token_ids.dim() != 2 or draft_token_ids.shape[0] != batch:
            raise ValueError(
                f"draft_token_ids must be [{batch}, K], got {tuple(draft_token_ids.shape)}"
            )
        width = draft_token_ids.shape[1]
        if any(n < 0 or n > width for n in num_draft_tokens):
            raise ValueError(
                f"num_draft_tokens must lie in [0, {width}], got {list(num_draft_tokens)}"
            )
        if sum(num_draft_tokens) + batch != meta.num_rows:
            raise ValueError(
                f"{meta.num_rows} verify rows do not match num_draft_tokens "
                f"(need {sum(num_draft_tokens) + batch})"
            )
        device = logits.device
        if meta.all_greedy and device.type == "cpu":
            # The greedy rule on host lists (the same decisions as below; nothing to wait for on a CPU).
            ids = self.sampler.greedy_token_ids(logits, meta).tolist()
            rows = greedy_verify_rows(ids, draft_token_ids.tolist(), num_draft_tokens, width)
            return self._output(logits, meta, num_draft_tokens, torch.tensor(rows, dtype=torch.int64))
        starts = list(accumulate((n + 1 for n in num_draft_tokens), initial=0))[:-1]
        if not meta.all_greedy:
            target_probs = self.sampler.compute_probs(logits, meta)  # [R, V]: p_i of request b in row index[b, i]
            greedy = [meta.is_greedy[s] for s in starts]
            generators = meta.generators(starts)
            if device.type == "cpu" and draft_probs is None:  # the tests on host lists (the same tokens)
                out = rejection_sample_rows(target_probs, draft_token_ids.tolist(), num_draft_tokens, width,
                                            generators, greedy)
                return self._output(logits, meta, num_draft_tokens, out)
        num_drafts = to_device(list(num_draft_tokens), torch.int64, device).unsqueeze(1)
        slots = torch.arange(width + 1, device=device)
        # Slot j of request b reads row start_b + min(j, k_b): slots past the bonus repeat it.
        index = to_device(starts, torch.int64, device).unsqueeze(1) + torch.minimum(
            slots, num_drafts
        )
        drafts = torch.where(slots[:width] < num_drafts, draft_token_ids.long(), PLACEHOLDER)
        if meta.all_greedy:
            # Every row greedy: p is the one-hot of the processed argmax, so the rule needs only the
            # ids (no [B, K+1, V] distributions; the same decisions, checked in the tests).
            target_ids = self.sampler.greedy_token_ids(logits, meta)[index]
            out = greedy_verify(target_ids, drafts)
        else:
            out = _rejection_sample(
                target_probs, index, drafts, draft_probs, generators, to_device(greedy, torch.bool, device),
                any_random=not all(greedy), any_greedy=any(greedy),
            )
        return self._output(logits, meta, num_draft_tokens, out)

    def _output(self, logits: torch.Tensor, meta: SamplingMetadata, num_draft_tokens: Sequence[int],
                out: torch.Tensor) -> RejectionOutput:
        """The verdict ``out`` with the logprobs its rows ask for (none: None)."""
        if meta.max_num_logprobs is None:
            return RejectionOutput(out, None)
        return RejectionOutput(out, self._logprobs(logits, meta, num_draft_tokens, out))

    @staticmethod
    def _logprobs(
        logits: torch.Tensor,
        meta: SamplingMetadata,
        num_draft_tokens: Sequence[int],
        out: torch.Tensor,
    ) -> LogprobsTensors:
        assert meta.max_num_logprobs is not None
        device = logits.device
        request_of_row = [b for b, n in enumerate(num_draft_tokens) for _ in range(n + 1)]
        slot_of_row = [j for n in num_draft_tokens for j in range(n + 1)]
        row_ids = out[
            to_device(request_of_row, torch.int64, device), to_device(slot_of_row, torch.int64, device)
        ]
        return compute_logprobs(logits, row_ids, meta.max_num_logprobs)

    __call__ = forward
