"""The worker's tokenizer-dependent request constraints: grammar matchers and bad-word token ids.

Lives on the worker, next to the runner's host mirror (``RequestState``), because that is where
both the committed tokens (reconciliation) and the drafts being verified are known: no extra
engine-side synchronisation is needed. The lifecycle follows the runner's request states:

- ``add_request`` when the runner learns a request, including a request resuming after preemption:
  its matcher is rebuilt and advanced over the committed outputs it arrives with, so the grammar
  state is consistent by construction (a preempted request's matcher was dropped with its state);
- ``accept`` with each step's committed tokens, called from the runner's ``_apply_tokens``; with
  async scheduling, and with deferred reconciliation, that happens before the next step samples, so
  masks are always computed from the committed state plus the drafts of the step being verified;
- ``remove_requests`` when the runner drops a finished, aborted or preempted request.

The tokenizer and the compiler are built on first use: engines that never see a constrained
request never load them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tandem.sample.bad_words import BadWordIds, tokenize_bad_words
from tandem.sampling_params import SamplingParams
from tandem.structured.bitmask import VerifyMasks, build_verify_masks
from tandem.structured.grammar import GrammarCompiler, RequestGrammar, build_tokenizer_info

if TYPE_CHECKING:
    from tandem.model.loader.tokenizer import Tokenizer

_BAD_WORDS_CACHE = 1024


class StructuredOutputManager:
    def __init__(
        self,
        load_tokenizer: Callable[[], Tokenizer],
        vocab_size: int,
        stop_token_ids: Iterable[int],
    ) -> None:
        self._load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = frozenset(stop_token_ids)
        self._tokenizer: Tokenizer | None = None
        self._compiler: GrammarCompiler | None = None
        self.grammars: dict[str, RequestGrammar] = {}
        self._bad_words: OrderedDict[tuple[str, ...], BadWordIds] = OrderedDict()

    # -- lazily built ------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = self._load_tokenizer()
        return self._tokenizer

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            info = build_tokenizer_info(self.tokenizer, self.vocab_size, self.stop_token_ids)
            self._compiler = GrammarCompiler(info)
        return self._compiler

    # -- request lifecycle -------------------------------------------------------------------------
    def add_request(
        self, req_id: str, params: SamplingParams, output_token_ids: Sequence[int]
    ) -> None:
        if params.structured_outputs is None:
            return
        grammar = RequestGrammar(req_id, self.compiler.compile(params.structured_outputs))
        grammar.accept_committed(output_token_ids)  # a resumed request: replay its outputs
        self.grammars[req_id] = grammar

    def remove_requests(self, req_ids: Iterable[str]) -> None:
        for rid in req_ids:
            self.grammars.pop(rid, None)

    def accept(self, req_id: str, tokens: Sequence[int]) -> None:
        """Committed tokens of one step (the runner's host mirror just appended them)."""
        grammar = self.grammars.get(req_id)
        if grammar is not None:
            grammar.accept_committed(tokens)

    # -- per step ----------------------------------------------------------------------------------
    def verify_masks(
        self, req_ids: Sequence[str], drafts: Sequence[Sequence[int]], num_rows: Sequence[int]
    ) -> VerifyMasks:
        """Masks for the sampled rows of one step (see ``bitmask.build_verify_masks``)."""
        grammars = [self.grammars.get(rid) for rid in req_ids]
        return build_verify_masks(grammars, drafts, num_rows, self.vocab_size)

    def bad_words_ids(self, words: Sequence[str]) -> BadWordIds:
        """The token sequences of a request's ``bad_words`` (cached by the word list)."""
        key = tuple(words)
        if not key:
            return ()
        hit = self._bad_words.get(key)
        if hit is None:
            tok = self.tokenizer
            hit = tokenize_bad_words(key, lambda text: tok.encode(text, add_special_tokens=False))
            self._bad_words[key] = hit
            if len(self._bad_words) > _BAD_WORDS_CACHE:
                self._bad_words.popitem(last=False)
        else:
            self._bad_words.move_to_end(key)
        return hit

    def stats(self) -> dict[str, Any]:
        return {
            "num_grammars": len(self.grammars),
            "num_compiled": 0 if self._compiler is None else self._compiler.num_compiled,
        }
