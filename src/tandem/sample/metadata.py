"""Per-row sampling metadata: the tensors the sampler needs, built once per step on the host.

A *row* is one row of the logits matrix that needs a token: one per request normally, k + 1
consecutive verify rows per request under speculative decoding (verify row j's context is the
committed outputs plus the first j draft tokens, and it samples output position
``len(committed) + j``). Everything here is per row, so the sampler never needs to know which rows
belong to the same request.

Building is host work (Python lists into a few small tensors). The expensive parts — ``[N, V]``
output token counts and prompt masks for penalties, ``[M, V]`` allowed-token masks — are built only
when some row needs them, and the fast-path flags let a plain greedy or plain temperature batch skip
every processor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem.sample.bad_words import BadWordIds, banned_tokens
from tandem.sample.rng import RowRng, make_row_rng, noise_source, position_key
from tandem.sampling_params import SamplingParams

TokenIds = Sequence[int] | torch.Tensor


def to_device(data: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on ``device``.

    On CUDA the copy goes through pinned memory and does not block: a pageable copy would wait for
    the work already queued (the model forward), a hidden synchronisation.
    """
    t = torch.tensor(data, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass(frozen=True)
class RowSpec:
    """What the sampler needs to know about one logits row.

    ``seed`` is always set: the engine uses ``params.seed`` when the user gave one and assigns a
    seed to unseeded requests. ``position`` is the index of the output token this row samples
    (``len(output_token_ids)`` for a normal row; committed outputs + j for verify row j).
    ``output_token_ids`` is the row's context for penalties and may hold negative placeholders,
    which are ignored. ``eos_token_ids`` are the model's EOS ids, masked together with
    ``stop_token_ids`` while fewer than ``min_tokens`` outputs exist (unless ``ignore_eos``).
    ``bad_words_token_ids`` are the request's bad words as token sequences (``bad_words.py``),
    matched against ``output_token_ids``.
    """

    params: SamplingParams
    prompt_token_ids: TokenIds
    output_token_ids: TokenIds
    seed: int
    position: int
    eos_token_ids: Sequence[int] = ()
    bad_words_token_ids: BadWordIds = ()


@dataclass(frozen=True)
class PenaltyTensors:
    presence: torch.Tensor  # [N] float32
    frequency: torch.Tensor  # [N] float32
    repetition: torch.Tensor  # [N] float32
    output_counts: torch.Tensor  # [N, V] float32: occurrences of each token in the row's outputs
    prompt_mask: torch.Tensor  # [N, V] bool: token occurs in the prompt


@dataclass(frozen=True)
class TokenBias:
    """Sparse additive bias: ``logits[rows[i], token_ids[i]] += values[i]``."""

    rows: torch.Tensor  # [P] int64
    token_ids: torch.Tensor  # [P] int64
    values: torch.Tensor  # [P] float32


@dataclass(frozen=True)
class AllowedTokens:
    """Whitelists of the rows that have one: ``mask[i]`` (True = allowed) is row ``rows[i]``'s."""

    rows: torch.Tensor  # [M] int64
    mask: torch.Tensor  # [M, V] bool


@dataclass(frozen=True)
class BannedTokens:
    """Sparse ban: ``logits[rows[i], token_ids[i]] = -inf``."""

    rows: torch.Tensor  # [P] int64
    token_ids: torch.Tensor  # [P] int64


@dataclass(frozen=True)
class SamplingMetadata:
    num_rows: int
    vocab_size: int
    device: torch.device
    # fast-path flags
    all_greedy: bool
    all_random: bool
    no_penalties: bool
    no_top_k: bool
    no_top_p: bool
    no_min_p: bool
    max_num_logprobs: int | None  # None: no row asked for logprobs
    # per row
    is_greedy: tuple[bool, ...]  # host copy of greedy_mask
    generator_keys: tuple[int, ...]  # position_key(seed, position)
    greedy_mask: torch.Tensor  # [N] bool
    temperature: (
        torch.Tensor | None
    )  # [N] float32, 1.0 on greedy rows; None when no row needs scaling
    top_k: torch.Tensor | None  # [N] int64 in [1, V]; V = disabled
    top_p: torch.Tensor | None  # [N] float32; 1.0 = disabled
    min_p: torch.Tensor | None  # [N] float32; 0.0 = disabled
    penalties: PenaltyTensors | None
    logit_bias: TokenBias | None
    allowed: AllowedTokens | None
    min_tokens_ban: BannedTokens | None
    bad_words_ban: BannedTokens | None = None

    def generators(self, rows: Sequence[int] | None = None) -> list[RowRng | None]:
        """Fresh position-keyed sources for ``rows`` (default: every row; a verify takes each request's first row),
        None for greedy rows: generators or native streams (``rng.make_row_rng``).

        Fresh on every call, so sampling twice from the same metadata gives the same tokens.
        """
        native = noise_source(self.device) == "native"
        rows = range(self.num_rows) if rows is None else rows
        return [None if self.is_greedy[r] else make_row_rng(self.generator_keys[r], self.device, native) for r in rows]

    @classmethod
    def build(
        cls, rows: Sequence[RowSpec], vocab_size: int, device: torch.device | str, checked: bool = False
    ) -> SamplingMetadata:
        """``checked``: the caller validated every row's parameters and EOS ids already (the worker does
        when a request is admitted), so they are not checked again here."""
        if not rows:
            raise ValueError("rows must not be empty")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        device = torch.device(device)
        params = [row.params for row in rows]
        for row in () if checked else rows:
            row.params.check_vocab(vocab_size)
            for tid in row.eos_token_ids:
                if not 0 <= tid < vocab_size:
                    raise ValueError(
                        f"eos_token_ids: {tid} is outside the vocabulary ({vocab_size})"
                    )
            if row.position < 0:
                raise ValueError(f"position must be non-negative, got {row.position}")
        is_greedy = tuple(p.greedy for p in params)

        def floats(values: list[float]) -> torch.Tensor:
            return to_device(values, torch.float32, device)

        temps = [1.0 if g else p.temperature for p, g in zip(params, is_greedy)]
        top_k = [
            vocab_size if g or p.top_k == -1 else min(p.top_k, vocab_size)
            for p, g in zip(params, is_greedy)
        ]
        top_p = [1.0 if g else p.top_p for p, g in zip(params, is_greedy)]
        min_p = [0.0 if g else p.min_p for p, g in zip(params, is_greedy)]
        no_penalties = not any(p.has_penalties for p in params)
        no_temperature = all(t == 1.0 for t in temps)
        no_top_k = all(k == vocab_size for k in top_k)
        no_top_p = all(p == 1.0 for p in top_p)
        no_min_p = all(p == 0.0 for p in min_p)
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            num_rows=len(rows),
            vocab_size=vocab_size,
            device=device,
            all_greedy=all(is_greedy),
            all_random=not any(is_greedy),
            no_penalties=no_penalties,
            no_top_k=no_top_k,
            no_top_p=no_top_p,
            no_min_p=no_min_p,
            max_num_logprobs=max(logprobs) if logprobs else None,
            is_greedy=is_greedy,
            generator_keys=tuple(position_key(row.seed, row.position) for row in rows),
            greedy_mask=to_device(is_greedy, torch.bool, device),
            temperature=None if no_temperature else floats(temps),
            top_k=None if no_top_k else to_device(top_k, torch.int64, device),
            top_p=None if no_top_p else floats(top_p),
            min_p=None if no_min_p else floats(min_p),
            penalties=None if no_penalties else _penalties(rows, vocab_size, device),
            logit_bias=_logit_bias(params, device),
            allowed=_allowed(params, vocab_size, device),
            min_tokens_ban=_min_tokens_ban(rows, device),
            bad_words_ban=_bad_words_ban(rows, device),
        )


def _as_ids(ids: TokenIds, vocab_size: int, device: torch.device) -> torch.Tensor:
    """1-D int64 ids on ``device``; negative placeholders become ``vocab_size`` (a pad column)."""
    if isinstance(ids, torch.Tensor):
        t = ids.to(device=device, dtype=torch.int64).reshape(-1)
    else:
        ids = list(ids)
        if ids and max(ids) >= vocab_size:
            raise ValueError(f"token id {max(ids)} is outside the vocabulary ({vocab_size})")
        t = to_device(ids, torch.int64, device)
    return torch.where(t < 0, vocab_size, t)


def _token_counts(seqs: list[TokenIds], vocab_size: int, device: torch.device) -> torch.Tensor:
    """``[N, V]`` float32 occurrence counts, one scatter_add over the padded id matrix."""
    ids = [_as_ids(s, vocab_size, device) for s in seqs]
    padded = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=vocab_size)
    counts = torch.zeros(len(seqs), vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, padded, torch.ones(padded.shape, dtype=torch.float32, device=device))
    return counts[:, :vocab_size].contiguous()


def _penalties(rows: Sequence[RowSpec], vocab_size: int, device: torch.device) -> PenaltyTensors:
    return PenaltyTensors(
        presence=to_device([r.params.presence_penalty for r in rows], torch.float32, device),
        frequency=to_device([r.params.frequency_penalty for r in rows], torch.float32, device),
        repetition=to_device([r.params.repetition_penalty for r in rows], torch.float32, device),
        output_counts=_token_counts([r.output_token_ids for r in rows], vocab_size, device),
        prompt_mask=_token_counts([r.prompt_token_ids for r in rows], vocab_size, device) > 0,
    )


def _logit_bias(params: list[SamplingParams], device: torch.device) -> TokenBias | None:
    entries = [(i, tid, v) for i, p in enumerate(params) for tid, v in (p.logit_bias or {}).items()]
    if not entries:
        return None
    rows, tids, values = zip(*entries)
    return TokenBias(
        rows=to_device(rows, torch.int64, device),
        token_ids=to_device(tids, torch.int64, device),
        values=to_device(values, torch.float32, device),
    )


def _allowed(
    params: list[SamplingParams], vocab_size: int, device: torch.device
) -> AllowedTokens | None:
    rows = [i for i, p in enumerate(params) if p.allowed_token_ids is not None]
    if not rows:
        return None
    pairs = [(m, tid) for m, i in enumerate(rows) for tid in params[i].allowed_token_ids or ()]
    mask = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)
    mask[
        to_device([m for m, _ in pairs], torch.int64, device),
        to_device([tid for _, tid in pairs], torch.int64, device),
    ] = True
    return AllowedTokens(rows=to_device(rows, torch.int64, device), mask=mask)


def _min_tokens_ban(rows: Sequence[RowSpec], device: torch.device) -> BannedTokens | None:
    """EOS and stop ids are banned on rows that sample one of the first ``min_tokens`` outputs."""
    pairs: list[tuple[int, int]] = []
    for i, row in enumerate(rows):
        p = row.params
        if row.position >= p.min_tokens:
            continue
        banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(row.eos_token_ids))
        if p.allowed_token_ids is not None and set(p.allowed_token_ids) <= banned:
            raise ValueError(
                f"row {i}: every allowed token is an EOS/stop id banned by "
                f"min_tokens={p.min_tokens}"
            )
        pairs.extend((i, tid) for tid in sorted(banned))
    if not pairs:
        return None
    ban_rows, ban_tids = zip(*pairs)
    return BannedTokens(
        rows=to_device(ban_rows, torch.int64, device),
        token_ids=to_device(ban_tids, torch.int64, device),
    )


def _bad_words_ban(rows: Sequence[RowSpec], device: torch.device) -> BannedTokens | None:
    """The last token of every bad word whose other tokens end the row's context."""
    pairs = [
        (i, tid)
        for i, row in enumerate(rows)
        if row.bad_words_token_ids
        for tid in banned_tokens(row.output_token_ids, row.bad_words_token_ids)
    ]
    if not pairs:
        return None
    ban_rows, ban_tids = zip(*pairs)
    return BannedTokens(
        rows=to_device(ban_rows, torch.int64, device),
        token_ids=to_device(ban_tids, torch.int64, device),
    )
