"""Structured outputs (xgrammar): grammars compiled per constraint, one matcher per request on the
worker, bitmasks for every verify row. See ``manager.py`` for where the state lives and why."""

from __future__ import annotations

from tandem.structured.grammar import (
    GrammarCompiler,
    RequestGrammar,
    build_grammar,
    build_tokenizer_info,
    check_structured_outputs,
)

__all__ = [
    "GrammarCompiler",
    "RequestGrammar",
    "build_grammar",
    "build_tokenizer_info",
    "check_structured_outputs",
]
