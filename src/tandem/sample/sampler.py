"""The sampler: one token per logits row, greedy or random, with optional logprobs.

Pipeline for a ``[N, V]`` logits matrix (see ``logits_processors.py`` for the order and its
reasons): raw logprobs (if asked) → whitelist / bias → min_tokens ban → bad words → penalties →
greedy argmax → temperature → min_p → top-k / top-p → softmax → exponential race with the row's
position-keyed noise (``rng.py``).

Fast paths: a plain greedy batch is one argmax; a plain temperature batch is a division, a softmax
and the race. Nothing here moves data to the host; the only host work is one generator per random
row.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tandem.sample.argmax import argmax_last
from tandem.sample.logits_processors import (
    apply_logit_bias_and_allowed,
    apply_min_p,
    apply_min_tokens_mask,
    apply_penalties,
    apply_temperature,
    apply_top_k_top_p,
)
from tandem.sample.metadata import SamplingMetadata
from tandem.sample.rng import exponential_noise, race_sample


class LogprobsTensors(NamedTuple):
    """Logprobs of the raw model distribution (``log_softmax`` of the unprocessed logits, vLLM's
    default
    ``raw_logprobs``). Column 0 is the sampled token, columns 1..n the top-n tokens, best first."""

    logprob_token_ids: torch.Tensor  # [N, n + 1] int64
    logprobs: torch.Tensor  # [N, n + 1] float32
    selected_token_ranks: torch.Tensor  # [N] int64: 1 + number of tokens strictly more likely


class SamplerOutput(NamedTuple):
    sampled_token_ids: torch.Tensor  # [N] int64
    logprobs: LogprobsTensors | None  # when some row asked; n = max over the rows


def compute_logprobs(
    raw_logits: torch.Tensor, token_ids: torch.Tensor, num_logprobs: int
) -> LogprobsTensors:
    """Raw logprobs of ``token_ids`` [N] plus the top ``num_logprobs`` per row.

    Ranks are 1-based competition ranks: a token tied with others shares the best rank. Negative ids
    (padding) are read as token 0; the caller ignores those rows.
    """
    logprobs = raw_logits.float().log_softmax(dim=-1)
    ids = token_ids.clamp_min(0).unsqueeze(1)
    token_logprobs = logprobs.gather(1, ids)
    ranks = (logprobs > token_logprobs).sum(dim=-1) + 1
    if num_logprobs > 0:
        top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=-1)
        ids = torch.cat([ids, top_ids], dim=1)
        token_logprobs = torch.cat([token_logprobs, top_logprobs], dim=1)
    return LogprobsTensors(ids, token_logprobs, ranks)


class Sampler:
    """Stateless; all per-step state lives in :class:`SamplingMetadata`."""

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row of ``logits`` [N, V] (float32; other float types are upcast)."""
        _check(logits, meta)
        logits = logits.float()
        plain = (meta.no_penalties and meta.allowed is None and meta.logit_bias is None
                 and meta.min_tokens_ban is None and meta.bad_words_ban is None)
        processed = logits if plain else self.processed_logits(logits, meta)
        if meta.all_greedy:
            sampled = argmax_last(processed)
        else:
            probs = self.random_probs(processed, meta)
            noise = exponential_noise(
                meta.num_rows, meta.vocab_size, meta.generators(), logits.device
            )
            sampled = race_sample(probs, noise)
            if not meta.all_random:
                sampled = torch.where(meta.greedy_mask, argmax_last(processed), sampled)
        logprobs = None
        if meta.max_num_logprobs is not None:
            logprobs = compute_logprobs(logits, sampled, meta.max_num_logprobs)
        return SamplerOutput(sampled, logprobs)

    __call__ = forward

    def compute_probs(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """The processed target distribution [N, V] float32 that :meth:`forward` samples from.

        Random rows: softmax after every processor. Greedy rows: the one-hot of the argmax that
        :meth:`forward` would return (the exact distribution of a greedy row, so speculative
        verification of a greedy row accepts exactly the tokens greedy decoding would produce).
        """
        _check(logits, meta)
        processed = self.processed_logits(logits.float(), meta)
        if meta.all_greedy:
            return _one_hot_argmax(processed)
        probs = self.random_probs(processed, meta)
        if meta.all_random:
            return probs
        return torch.where(meta.greedy_mask.unsqueeze(1), _one_hot_argmax(processed), probs)

    def greedy_token_ids(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """[N] the argmax of every row's processed logits: the token :meth:`forward` returns for a
        greedy row (the one-hot :meth:`compute_probs` gives it)."""
        _check(logits, meta)
        logits = logits.float()
        plain = (meta.no_penalties and meta.allowed is None and meta.logit_bias is None
                 and meta.min_tokens_ban is None and meta.bad_words_ban is None)
        return argmax_last(logits if plain else self.processed_logits(logits, meta))

    @staticmethod
    def processed_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Steps that can move the argmax: whitelist, bias, min_tokens ban, penalties."""
        out = logits
        if meta.allowed is not None or meta.logit_bias is not None:
            allowed, bias = meta.allowed, meta.logit_bias
            out = apply_logit_bias_and_allowed(
                out,
                allowed_rows=None if allowed is None else allowed.rows,
                allowed_mask=None if allowed is None else allowed.mask,
                bias_rows=None if bias is None else bias.rows,
                bias_token_ids=None if bias is None else bias.token_ids,
                bias_values=None if bias is None else bias.values,
            )
        if meta.min_tokens_ban is not None:
            out = apply_min_tokens_mask(
                out, meta.min_tokens_ban.rows, meta.min_tokens_ban.token_ids
            )
        if meta.bad_words_ban is not None:  # the same sparse -inf ban, other token ids
            out = apply_min_tokens_mask(out, meta.bad_words_ban.rows, meta.bad_words_ban.token_ids)
        if meta.penalties is not None:
            pen = meta.penalties
            out = apply_penalties(
                out,
                prompt_mask=pen.prompt_mask,
                output_counts=pen.output_counts,
                presence=pen.presence,
                frequency=pen.frequency,
                repetition=pen.repetition,
            )
        return out

    @staticmethod
    def random_probs(processed: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Steps that keep the argmax (temperature, min_p, top-k / top-p), then softmax.

        Applied to every row; greedy rows carry neutral parameters and their result is not used.
        """
        out = processed
        if meta.temperature is not None:
            out = apply_temperature(out, meta.temperature)
        if meta.min_p is not None:
            out = apply_min_p(out, meta.min_p)
        if meta.top_k is not None or meta.top_p is not None:
            out = apply_top_k_top_p(out, meta.top_k, meta.top_p)
        return out.softmax(dim=-1)


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    one_hot = torch.zeros_like(logits)
    return one_hot.scatter_(1, argmax_last(logits, keepdim=True), 1.0)


def _check(logits: torch.Tensor, meta: SamplingMetadata) -> None:
    if logits.dim() != 2 or tuple(logits.shape) != (meta.num_rows, meta.vocab_size):
        raise ValueError(
            f"logits: expected shape ({meta.num_rows}, {meta.vocab_size}), "
            f"got {tuple(logits.shape)}"
        )
    if logits.device.type != meta.device.type:
        raise ValueError(f"logits are on {logits.device}, the metadata on {meta.device}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
