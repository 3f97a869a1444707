"""Structured-output constraints as xgrammar grammars: validate, compile (cached), match.

Three levels, each where it is needed:
- ``build_grammar`` turns ``StructuredOutputsParams`` into an ``xgrammar.Grammar``. It needs no
  tokenizer, so the engine front end uses it to refuse a bad schema / regex / EBNF before the request
  is queued (``check_structured_outputs``; a ``ValueError`` that the server turns into a 400);
- ``GrammarCompiler`` compiles grammars against the model's vocabulary (``TokenizerInfo`` built from
  tandem's ``Tokenizer``) and keeps the compiled grammars in an LRU keyed by the constraint;
- ``RequestGrammar`` is one request's matcher. It only ever advances by *committed* tokens; checking
  drafts advances it temporarily and rolls it back (``bitmask.py``).

xgrammar is imported lazily: tandem runs without it until a request asks for structured outputs.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tandem.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar

    from tandem.model.loader.tokenizer import Tokenizer

logger = logging.getLogger("tandem.structured")

_CPP_PREFIX = re.compile(r"^\[[^\]]*\]\s+\S+:\d+:\s*")


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError as exc:  # pragma: no cover - xgrammar is installed with tandem's extras
        raise ValueError(
            "structured_outputs needs the xgrammar package: pip install xgrammar"
        ) from exc
    return xgrammar


def _clean(exc: Exception) -> str:
    """xgrammar's C++ errors start with a timestamp and a source location: drop them."""
    return _CPP_PREFIX.sub("", str(exc).strip()).strip()


def spec_key(params: StructuredOutputsParams) -> tuple[str, str]:
    """A hashable key of one constraint (a JSON schema may arrive as a dict or as text). The
    schema's key order is kept: xgrammar emits object properties in the order they are listed, so
    two schemas that differ only in order are different constraints."""
    if params.json is not None:
        schema = params.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"structured_outputs: json is not valid JSON: {exc}") from exc
        return ("json", json.dumps(schema, separators=(",", ":")))
    if params.json_object:
        return ("json_object", "")
    if params.regex is not None:
        return ("regex", params.regex)
    if params.choice is not None:
        return ("choice", json.dumps(list(params.choice)))
    assert params.grammar is not None  # StructuredOutputsParams guarantees exactly one field
    return ("grammar", params.grammar)


def _choice_ebnf(choices: Sequence[str]) -> str:
    # JSON string literals use the escapes xgrammar's EBNF string literals accept.
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def build_grammar(params: StructuredOutputsParams) -> Any:
    """The constraint as an ``xgrammar.Grammar``; ``ValueError`` naming the field when it is bad."""
    xgr = _xgr()
    kind, text = spec_key(params)
    try:
        if kind == "json":
            return xgr.Grammar.from_json_schema(text)
        if kind == "json_object":  # an object, as OpenAI's json_object promises (not any value)
            return xgr.Grammar.from_json_schema('{"type": "object"}')
        if kind == "regex":
            return xgr.Grammar.from_regex(text)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(_choice_ebnf(params.choice or ()))
        return xgr.Grammar.from_ebnf(text)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(f"structured_outputs: invalid {kind}: {_clean(exc)}") from exc


def check_structured_outputs(params: StructuredOutputsParams | None) -> None:
    """Refuse a constraint that does not compile (front end, before the request is queued)."""
    if params is not None:
        build_grammar(params)


def build_tokenizer_info(
    tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Iterable[int]
) -> Any:
    """xgrammar's view of the vocabulary: each token's raw bytes (``RAW``: already decoded, so it
    works for byte-level and SentencePiece vocabularies alike). Special tokens get no text, so no
    grammar can spell them; the stop tokens are the model's EOS ids, allowed only where the grammar
    may end. Ids past the tokenizer (a padded embedding) are empty too."""
    xgr = _xgr()
    n = min(tokenizer.vocab_size, vocab_size)
    vocab = [tokenizer.token_bytes(i) for i in range(n)] + [b""] * (vocab_size - n)
    for i in tokenizer.all_special_ids:
        if 0 <= i < vocab_size:
            vocab[i] = b""
    return xgr.TokenizerInfo(
        vocab,
        xgr.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=sorted(set(stop_token_ids)),
    )


class GrammarCompiler:
    """Compiles constraints against one vocabulary; an LRU of compiled grammars keyed by spec."""

    def __init__(self, tokenizer_info: Any, cache_size: int = 256, max_threads: int = 1) -> None:
        self.tokenizer_info = tokenizer_info
        self.vocab_size = int(tokenizer_info.vocab_size)
        self._compiler = _xgr().GrammarCompiler(
            tokenizer_info, max_threads=max_threads, cache_enabled=False
        )
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cache_size = cache_size
        self.num_compiled = 0  # cache misses, for tests

    def compile(self, params: StructuredOutputsParams) -> Any:
        key = spec_key(params)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        compiled = self._compiler.compile_grammar(build_grammar(params))
        self.num_compiled += 1
        self._cache[key] = compiled
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return compiled


class RequestGrammar:
    """One request's grammar state. The matcher stands at the request's committed tokens between
    calls; ``bitmask.fill_verify_rows`` moves it over drafts and back."""

    def __init__(self, req_id: str, compiled: Any) -> None:
        self.req_id = req_id
        self.matcher: xgrammar.GrammarMatcher = _xgr().GrammarMatcher(compiled)
        self.failed = False  # a committed token the grammar refused: constraint dropped, logged

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    @property
    def active(self) -> bool:
        """Whether this request's next rows are constrained."""
        return not self.failed and not self.terminated

    def accept_committed(self, tokens: Iterable[int]) -> None:
        """Advance by committed tokens. Tokens after the grammar's stop token are the ones the
        scheduler drops (the request finishes there) and are ignored."""
        for tok in tokens:
            if self.failed or self.terminated:
                return
            if not self.matcher.accept_token(int(tok)):
                # Only possible when the user's own constraints masked every token the grammar
                # allows (bias, allowed_token_ids, bad words, min_tokens): the grammar cannot follow.
                self.failed = True
                logger.error(
                    "request %s: committed token %d is outside its grammar; the constraint is "
                    "dropped for the rest of the request",
                    self.req_id,
                    tok,
                )
