"""SentencePiece-style BPE vocabularies from GGUF (``tokenizer.ggml.model = "llama"``).

A GGUF file stores such a vocabulary as ``tokenizer.ggml.tokens`` (pieces spelled with "▁" for a
space), ``scores`` and ``token_type`` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
6 byte), and no merges. tandem rebuilds it as a ``tokenizers`` BPE model so that it tokenizes
exactly like transformers does for the same file (``AutoTokenizer.from_pretrained(dir,
gguf_file=...)``, the reference tandem is tested against):

- Merges: every split of every piece into two pieces of the vocabulary, ranked by the piece's
  score, best first, as SentencePiece's BPE merges the adjacent pair whose union scores highest.
  Ties: the longer left half first.
- Byte fallback: a character without a piece becomes its UTF-8 bytes as the ``<0xNN>`` pieces.
- Spaces: " " becomes "▁" before BPE. ``tokenizer.ggml.add_space_prefix`` (true when absent)
  also puts a "▁" before the text, but only at its very start (not after a special token, and not
  when the text already starts with a space), and decoding strips that one space again: this is
  transformers' ``LlamaTokenizer`` (a ``Metaspace`` pre-tokenizer, prepend scheme "first").
- Decoding: "▁" -> " ", ``<0xNN>`` runs -> their bytes (U+FFFD for each byte of an incomplete
  character), pieces joined.
- Control pieces (3) and user-defined pieces (4, e.g. Gemma's "\\n\\n" or "<start_of_image>") are
  matched whole in the text before BPE, control ones as special tokens (dropped by
  ``decode(skip_special_tokens=True)``); so are the unknown/BOS/EOS/padding pieces, which
  transformers registers as special tokens whatever their type.
- The Gemma family (``GEMMA_FAMILY``), as transformers' ``gemma_tokenizer`` fixes it: the merge
  order is the pieces' order in the file, not their scores (the two agree for ordinary pieces,
  but control and user-defined pieces are scored -1000 and byte pieces 0); and the user-defined
  pieces of only spaces (ids 138-167 in Gemma 3) are stored as real spaces, so they are
  respelled with "▁" and reached through BPE rather than matched whole. These files say
  ``add_space_prefix = false``.

Known difference from transformers: it ignores ``add_space_prefix`` (its ``LlamaTokenizer``
always prepends, its ``GemmaTokenizer`` never does); tandem honours the flag, as llama.cpp does.
The two differ only for a non-Gemma file that says false or a Gemma file that says true.
"""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from tandem.model.loader.gguf_file import GGUFFile

_CONTROL, _USER_DEFINED = 3, 4
_SPACE = "\u2581"
# Architectures whose GGUF vocabulary was converted from Gemma's tokenizer (see above).
GEMMA_FAMILY = frozenset({"gemma", "gemma2", "gemma3"})


def respell_spaces(token: str) -> str:
    """A piece of only spaces, stored as real spaces, as the "▁" run the text turns into."""
    return _SPACE * len(token) if token and not token.strip(" ") else token


def spm_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: each split ``(left, right)`` of each
    piece into two pieces of the vocabulary, ordered by the piece's score (highest first), then
    by the length of ``left`` and of ``right`` (longest first), then by the pieces' order.

    This is transformers' ``generate_merges``. 262,144 pieces take about a second.
    """
    vocab = dict.fromkeys(tokens)  # membership only; keeps first-seen order
    score_of = dict(zip(tokens, scores, strict=True))
    ranked: list[tuple[float, int, int, str, str]] = []
    for token in vocab:
        score = score_of[token]
        # Longest left half first: the order the final sort keeps within one piece.
        for cut in range(len(token) - 1, 0, -1):
            left = token[:cut]
            if left in vocab:
                right = token[cut:]
                if right in vocab:
                    ranked.append((score, cut, len(token) - cut, left, right))
    # A stable sort on (score, left length, right length), highest first, as transformers does.
    ranked.sort(key=lambda m: (m[0], m[1], m[2]), reverse=True)
    return [(left, right) for _, _, _, left, right in ranked]


def spm_backend(gf: GGUFFile) -> tokenizers.Tokenizer:
    """The ``tokenizers`` pipeline for a ``tokenizer.ggml.model = "llama"`` file (see above)."""
    raw_tokens: list[str] = gf.require("tokenizer.ggml.tokens")
    gemma = str(gf.get("general.architecture", "")) in GEMMA_FAMILY
    tokens = [respell_spaces(t) for t in raw_tokens] if gemma else raw_tokens
    types: list[int] = gf.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(
            f"{gf.path}: tokenizer.ggml.token_type has {len(types)} entries for "
            f"{len(tokens)} tokens"
        )
    if gemma:
        ranks: Sequence[float] = range(0, -len(tokens), -1)
    else:
        ranks = gf.require("tokenizer.ggml.scores")
        if len(ranks) != len(tokens):
            raise ValueError(
                f"{gf.path}: tokenizer.ggml.scores has {len(ranks)} entries for "
                f"{len(tokens)} tokens"
            )

    def token_at(key: str) -> str | None:
        index = gf.get(f"tokenizer.ggml.{key}")
        return None if index is None else tokens[int(index)]

    unk = token_at("unknown_token_id")
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):  # ids would no longer be positions in the list
        repeated = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise ValueError(f"{gf.path}: tokenizer.ggml.tokens lists {repeated!r} twice")
    bpe = models.BPE(
        vocab=vocab,
        merges=spm_merges(tokens, ranks),
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = tokenizers.Tokenizer(bpe)
    prefix = bool(gf.get("tokenizer.ggml.add_space_prefix", True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=_SPACE, prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)

    named = {token_at(k) for k in ("bos_token_id", "eos_token_id", "unknown_token_id")}
    named.add(token_at("padding_token_id"))
    control = [t for t, kind in zip(tokens, types, strict=True) if kind == _CONTROL]
    control += sorted(t for t in named if t is not None and t not in control)
    # A user-defined piece that was respelled (only spaces) is reached through BPE instead.
    user = [
        t
        for t, raw, kind in zip(tokens, raw_tokens, types, strict=True)
        if kind == _USER_DEFINED and t == raw
    ]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return backend
