"""Streaming detokenization: turning each step's new token ids into the newly final text.

Decoding the whole output every step costs O(length) per token, and decoding each token alone is
wrong: a byte-level BPE token can end inside a multi-byte UTF-8 character (an emoji is often
split over 2-4 tokens), and a SentencePiece decoder drops the leading space of a sequence's first
token. So, as in vLLM, two offsets into the token ids are kept:

- ``read_offset``: tokens before it have been turned into emitted text;
- ``prefix_offset``: where the decode window starts, one emission before ``read_offset``, so
  the window always begins at a token that started a completed piece of text.

Each step decodes ``ids[prefix_offset:read_offset]`` and ``ids[prefix_offset:]``; the difference
is the delta. If the longer text ends in U+FFFD (an incomplete character), nothing is emitted and
the offsets stay put until a later token completes it; ``finish`` flushes whatever is left.

The window starts at the first output token, never inside the prompt: that way the deltas
concatenate to exactly ``tokenizer.decode(output_ids)`` for every decoder, including those that
treat the first token of a sequence specially.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tandem.model.loader.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        # The ``tokenizers`` object's own decode where ``Tokenizer.decode`` would only convert the ids, which are
        # already ints here (a few calls per token); a tokenizer with a decode of its own keeps it.
        plain = type(tokenizer).decode is Tokenizer.decode
        self._decode = tokenizer.backend.decode if plain else tokenizer.decode
        self._skip = skip_special_tokens
        self._ids: list[int] = [int(i) for i in prompt_ids]
        self.num_prompt_tokens = len(self._ids)
        self._prefix_offset = self._read_offset = self.num_prompt_tokens
        self._pieces: list[str] = []  # emitted deltas

    @property
    def output_ids(self) -> list[int]:
        return self._ids[self.num_prompt_tokens :]

    @property
    def text(self) -> str:
        """All output text emitted so far (text held back for an incomplete character excluded)."""
        if len(self._pieces) > 1:  # join lazily, once per read, not once per token
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def add_tokens(self, ids: Iterable[int], *, _finish: bool = False) -> str:
        """Append generated ids; return the text they complete (possibly ``""``)."""
        before = len(self._ids)
        self._ids.extend(int(i) for i in ids)
        if len(self._ids) == before and not _finish:
            return ""
        decode, known, skip = self._decode, self._ids, self._skip
        prefix_text = decode(known[self._prefix_offset : self._read_offset], skip_special_tokens=skip)
        new_text = decode(known[self._prefix_offset :], skip_special_tokens=skip)
        # an incomplete character (a byte-level piece still to come) is held back until the end
        if len(new_text) <= len(prefix_text) or (new_text.endswith(_REPLACEMENT) and not _finish):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._pieces.append(delta)
        return delta

    def finish(self) -> str:
        """Emit any text still held back (a sequence that ended inside a character); call once
        the request is done so that ``text`` equals the full decode of the output."""
        return self.add_tokens((), _finish=True)
