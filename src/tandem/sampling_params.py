"""Per-request sampling parameters, named and defaulted like vLLM's ``SamplingParams``.

Validation happens in the constructor and on every assignment (vLLM's scripts set fields of
``llm.get_default_sampling_params()``): every bad value raises ``ValueError`` naming the field, and a refused
assignment leaves the object as it was. The engine keeps its own copy of a request's params (the request
factory clones them), so changing an object after submitting it changes nothing in flight. How many logprobs
a request may ask for is the engine's ``max_logprobs``. No torch here: the sampler turns these into tensors.
"""

from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


class RequestOutputKind(enum.IntEnum):
    """vLLM's: what a streamed output carries (``AsyncLLM.generate``); ``LLM.generate`` returns final ones."""

    CUMULATIVE = 0  # everything so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # nothing until the request finishes


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Constraints for structured outputs; exactly one of the fields may be set."""

    json: str | dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        set_fields = [
            name
            for name, value in (
                ("json", self.json),
                ("json_object", self.json_object or None),
                ("regex", self.regex),
                ("choice", self.choice),
                ("grammar", self.grammar),
            )
            if value is not None
        ]
        if len(set_fields) != 1:
            raise ValueError(
                "structured_outputs: exactly one of json, json_object, regex, choice, grammar must be set "
                f"(got {set_fields or 'none'})"
            )
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("structured_outputs.choice must be a non-empty list of non-empty strings")


@dataclass(eq=True)
class SamplingParams:
    """How to sample one request's output (vLLM names and defaults)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or vLLM's 0): disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True
    bad_words: tuple[str, ...] = ()
    logit_bias: dict[int, float] | None = field(default=None, hash=False)
    allowed_token_ids: tuple[int, ...] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's: keep the prompt's last N tokens (-1: max_model_len's worth); the request factory cuts
    truncate_prompt_tokens: int | None = None
    # vLLM's: only a slow (Python) tokenizer puts spaces between special tokens; tandem's are fast ones,
    # which join them as they are, as vLLM's fast-tokenizer detokenizer does
    spaces_between_special_tokens: bool = True
    # vLLM's: free-form arguments for custom sampling code; carried, unread by tandem's sampler
    extra_args: dict[str, Any] | None = field(default=None, compare=False)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __init__(self, **kwargs: Any) -> None:
        known = {f.name: f for f in fields(self)}
        for name in kwargs:
            if name not in known:
                raise ValueError(f"unknown sampling field {name!r}")
        for name, f in known.items():
            if name in kwargs:
                value = kwargs[name]
            elif f.default_factory is not MISSING:  # pragma: no cover - no factories today
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, name, value)
        self._normalise()
        self._validate()

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.__dataclass_fields__:
            raise ValueError(f"unknown sampling field {name!r}")
        old = getattr(self, name)
        object.__setattr__(self, name, value)
        try:
            self._normalise()
            self._validate()
        except (ValueError, TypeError):
            object.__setattr__(self, name, old)
            raise

    # -- construction helpers -------------------------------------------------------------------------
    def _normalise(self) -> None:
        def as_tuple(name: str) -> None:
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, () if name != "allowed_token_ids" else None)
            elif isinstance(value, str):
                object.__setattr__(self, name, (value,))
            else:
                try:
                    object.__setattr__(self, name, tuple(value))
                except TypeError as exc:
                    raise ValueError(f"{name} must be a list, got {type(value).__name__}") from exc

        for name in ("stop", "stop_token_ids", "bad_words", "allowed_token_ids"):
            as_tuple(name)
        if isinstance(self.structured_outputs, dict):
            object.__setattr__(
                self, "structured_outputs", StructuredOutputsParams(**self.structured_outputs)
            )
        if self.top_k == 0 and not isinstance(self.top_k, bool):  # vLLM's "disabled"
            object.__setattr__(self, "top_k", -1)
        if isinstance(self.output_kind, int) and not isinstance(self.output_kind, (bool, RequestOutputKind)):
            try:
                object.__setattr__(self, "output_kind", RequestOutputKind(self.output_kind))
            except ValueError as exc:
                raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}") from exc
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias must be a mapping of token id to bias")
            try:
                bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError) as exc:
                raise ValueError("logit_bias must map integer token ids to numbers") from exc
            object.__setattr__(self, "logit_bias", bias)

    def _validate(self) -> None:
        def check_int(name: str, value: Any, *, allow_none: bool = False) -> None:
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")

        def check_num(name: str, value: Any) -> None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if value != value:  # NaN
                raise ValueError(f"{name} must not be NaN")

        check_int("n", self.n)
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        check_num("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        check_num("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        check_int("top_k", self.top_k)
        if self.top_k < -1 or self.top_k == 0:
            raise ValueError(f"top_k must be -1 (disabled) or at least 1, got {self.top_k}")
        check_num("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        check_int("seed", self.seed, allow_none=True)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            check_num(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        check_num("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be positive, got {self.repetition_penalty}")
        check_int("max_tokens", self.max_tokens, allow_none=True)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check_int(name, value, allow_none=True)
            if value is not None and value < -1:
                raise ValueError(f"{name} must be -1 (the whole vocabulary) or non-negative, got {value}")
        check_int("truncate_prompt_tokens", self.truncate_prompt_tokens, allow_none=True)
        if self.truncate_prompt_tokens is not None and (self.truncate_prompt_tokens < -1
                                                        or self.truncate_prompt_tokens == 0):
            raise ValueError(f"truncate_prompt_tokens must be -1 or at least 1, got {self.truncate_prompt_tokens}")
        if not isinstance(self.spaces_between_special_tokens, bool):
            raise ValueError("spaces_between_special_tokens must be a bool, got "
                             f"{self.spaces_between_special_tokens!r}")
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise ValueError(f"extra_args must be a dict, got {type(self.extra_args).__name__}")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        for stop in self.stop:
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
        for name in ("stop_token_ids", "allowed_token_ids"):
            for tid in getattr(self, name) or ():
                check_int(name, tid)
                if tid < 0:
                    raise ValueError(f"{name} must hold non-negative token ids, got {tid}")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids must not be empty")
        for word in self.bad_words:
            if not isinstance(word, str) or not word:
                raise ValueError(f"bad_words must be a list of non-empty strings, got {word!r}")

    # -- derived --------------------------------------------------------------------------------------
    @property
    def greedy(self) -> bool:
        """Temperature 0 (or below float noise) means argmax."""
        return self.temperature < 1e-5

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def tree_verifiable(self) -> bool:
        """Whether a draft tree's rows can be verified together: each row samples the same way whatever path
        leads to it (no penalties, logit bias, allowed ids, min_tokens, bad words, grammar) and no per-token
        logprobs are asked for. A request that is not gets no drafts in an engine that drafts trees."""
        return not (self.has_penalties or self.logit_bias or self.allowed_token_ids is not None or self.min_tokens
                    or self.bad_words or self.structured_outputs is not None or self.logprobs is not None)

    def clone(self, **overrides: Any) -> SamplingParams:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(overrides)
        return SamplingParams(**values)

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids named in the params must exist in the model's vocabulary."""
        ids = list(self.stop_token_ids) + list(self.allowed_token_ids or ())
        ids += list((self.logit_bias or {}).keys())
        for tid in ids:
            if not 0 <= tid < vocab_size:
                raise ValueError(f"token id {tid} is outside the vocabulary (size {vocab_size})")


# A pooling runner's requests: the prompt computed once, one token sampled (and dropped), the pooled hidden state
# returned (LLM.embed, /v1/embeddings).
POOLING_PARAMS = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

__all__ = ["POOLING_PARAMS", "RequestOutputKind", "SamplingParams", "StructuredOutputsParams"]
