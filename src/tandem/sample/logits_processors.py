"""Logits processors: pure functions of ``[N, V]`` float32 logits and per-row parameter tensors.

Each returns a new tensor and leaves its input alone. Masked tokens are set to ``-inf``. The sampler
applies them in vLLM's order:

1. allowed_token_ids whitelist and logit_bias,
2. min_tokens ban of EOS / stop ids, then the bad-words ban (``bad_words.py``; same masking),
3. penalties (repetition, then frequency, then presence)   — greedy rows take the argmax here,
4. temperature,
5. min_p,
6. top-k then top-p.

Steps 4–6 never change the argmax, which is why greedy rows can ignore them.
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


def apply_logit_bias_and_allowed(
    logits: torch.Tensor,
    *,
    allowed_rows: torch.Tensor | None = None,
    allowed_mask: torch.Tensor | None = None,
    bias_rows: torch.Tensor | None = None,
    bias_token_ids: torch.Tensor | None = None,
    bias_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mask tokens outside a row's whitelist, then add the sparse per-row biases.

    ``allowed_mask[i]`` ([M, V] bool, True = allowed) applies to row ``allowed_rows[i]``;
    ``logits[bias_rows[j], bias_token_ids[j]] += bias_values[j]``.
    """
    out = logits.clone()
    if allowed_rows is not None and allowed_mask is not None:
        out[allowed_rows] = out[allowed_rows].masked_fill(~allowed_mask, _NEG_INF)
    if bias_rows is not None and bias_token_ids is not None and bias_values is not None:
        out.index_put_((bias_rows, bias_token_ids), bias_values.to(out.dtype), accumulate=True)
    return out


def apply_min_tokens_mask(
    logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor
) -> torch.Tensor:
    """``logits[rows[j], token_ids[j]] = -inf``: EOS / stop ids of rows below ``min_tokens``."""
    out = logits.clone()
    out[rows, token_ids] = _NEG_INF
    return out


def apply_penalties(
    logits: torch.Tensor,
    *,
    prompt_mask: torch.Tensor,
    output_counts: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Repetition, frequency and presence penalties (HF / vLLM / OpenAI definitions).

    - repetition ``r`` (1 = off): for tokens seen in the prompt or the outputs, divide a positive
      logit by r and multiply a non-positive one by r;
    - frequency ``f``: subtract ``f * count`` (count in the outputs only);
    - presence ``p``: subtract ``p`` from tokens that occur in the outputs.

    ``prompt_mask`` [N, V] bool, ``output_counts`` [N, V] float, the three penalties [N].
    """
    output_mask = output_counts > 0
    seen = prompt_mask | output_mask
    rep = repetition.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    out = torch.where(seen, penalised, logits)
    out = out - frequency.unsqueeze(1) * output_counts
    return out - presence.unsqueeze(1) * output_mask.to(out.dtype)


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Divide each row by its temperature [N] (greedy rows carry 1.0, never 0)."""
    return logits / temperature.unsqueeze(1)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens less likely than ``min_p`` times the row's top probability (0 = off)."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, _NEG_INF)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Per-row top-k then top-p (nucleus), with one ascending sort of each row.

    ``top_k`` [N] int64 in [1, V] (V = off): keep tokens whose logit is at least the k-th largest
    (ties at the threshold are kept). ``top_p`` [N] float32 in (0, 1] (1 = off): among the top-k
    survivors, renormalised, keep the smallest set of most likely tokens whose mass reaches p; the
    most likely token always survives.
    """
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    if top_k is not None:
        # The k-th largest sits at ascending index V - k.
        kth = sorted_logits.gather(1, (vocab - top_k.to(torch.int64)).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, _NEG_INF)
    if top_p is not None:
        # A token goes when the mass at or below it (ascending) is at most 1 - p: the tokens above
        # it already reach p without it.
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1.0 - top_p).unsqueeze(1)
        drop[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, _NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
