"""Building tandem's ``Tokenizer`` from the ``tokenizer.ggml.*`` metadata of a GGUF file.

Two vocabularies are supported, by ``tokenizer.ggml.model``:

- ``"gpt2"``, byte-level BPE (this file): a vocabulary spelled in GPT-2's byte alphabet, ranked
  merges, and ``token_type`` marking control tokens (3, e.g. ``<|im_end|>``) and user-defined
  tokens (4), which must match whole before BPE runs.
- ``"llama"``, SentencePiece-style BPE with byte fallback (Gemma, Llama 2, ...): see
  ``tokenizer_spm.py``.

Both are chosen to tokenize exactly like transformers does for the same file
(``AutoTokenizer.from_pretrained(dir, gguf_file=...)``), the reference tandem is tested against.
For byte-level BPE, how the text is split before BPE follows ``tokenizer.ggml.pre``. For
``smollm`` that is GPT-2's own regex, *without* the split into single digits that the original
SmolLM2 ``tokenizer.json`` and llama.cpp apply first: the two disagree only on a run of whitespace
before a digit (``"  1"`` is ``Ġ Ġ 1`` here, ``ĠĠ 1`` in the original).

Special tokens and the chat template are read the same way for both. BOS is added by default for
``"llama"`` vocabularies when ``tokenizer.ggml.add_bos_token`` is absent (as llama.cpp and
transformers do), not for ``"gpt2"``. A file without ``tokenizer.chat_template`` gets the default
template of its architecture, if tandem has one (``chat_template.DEFAULT_CHAT_TEMPLATES``: Gemma 3).
For the Gemma family, ``<end_of_turn>`` also ends generation (llama.cpp treats it as
end-of-generation by its text; the files name only ``<eos>``).

The built ``tokenizers.Tokenizer`` (the backend) is kept per file (``GGUFFile.key``; the last ``_BACKEND_CACHE``
files) and shared by every ``Tokenizer`` built from that file in the process: an engine builds its tokenizer twice
(the front end, and the worker's checkpoint), and Gemma 3's 262,144-token vocabulary takes ~2-3 s to build on a
two-core machine (the default model's ~0.2 s). Sharing is safe because nothing changes a backend once built:
``Tokenizer`` only reads it, and what an engine may change (its chat template) lives on the ``Tokenizer``, which
is never shared. The backend encodes from several threads at once (``tokenizers`` takes ``&self``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from tandem.model.loader.chat_template import DEFAULT_CHAT_TEMPLATES, ChatTemplate
from tandem.model.loader.gguf_file import GGUFFile, PerFileCache
from tandem.model.loader.tokenizer import SpecialTokens, Tokenizer, byte_alphabet
from tandem.model.loader.tokenizer_spm import GEMMA_FAMILY, spm_backend

_CONTROL, _USER_DEFINED = 3, 4
_BACKEND_CACHE = 4  # files whose built backend is kept
_backends = PerFileCache(_BACKEND_CACHE)

# Llama 3's split: case-insensitive contractions, letters with one leading non-letter, numbers in
# groups of up to three digits, punctuation runs, newlines, and whitespace.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's split: the same, but every digit is its own piece.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> split regex, or None for GPT-2's built-in ByteLevel regex.
PRE_TOKENIZER_SPLITS: dict[str, str | None] = {
    "default": None,
    "gpt2": None,
    "gpt-2": None,
    "smollm": None,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


def _pre_tokenizer(pre: str, path: object) -> pre_tokenizers.PreTokenizer:
    if pre not in PRE_TOKENIZER_SPLITS:
        raise ValueError(
            f"{path}: unsupported tokenizer.ggml.pre {pre!r}; supported: "
            f"{sorted(PRE_TOKENIZER_SPLITS)}"
        )
    split = PRE_TOKENIZER_SPLITS[pre]
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _vocab(tokens: Sequence[str], types: Sequence[int]) -> dict[str, int]:
    """Token -> id. Ordinary tokens stored outside the byte alphabet (some converters write raw
    UTF-8) are respelled into it; control and user-defined tokens keep their text, because they
    are matched literally as added tokens."""
    alphabet = byte_alphabet()
    letters = set(alphabet.values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        kind = types[index] if index < len(types) else 1
        if kind not in (_CONTROL, _USER_DEFINED) and not set(token) <= letters:
            token = "".join(alphabet[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, index)
    return vocab


def byte_level_backend(gf: GGUFFile) -> tokenizers.Tokenizer:
    """The ``tokenizers`` pipeline for a ``tokenizer.ggml.model = "gpt2"`` file."""
    tokens: list[str] = gf.require("tokenizer.ggml.tokens")
    types: list[int] = gf.get("tokenizer.ggml.token_type") or []
    merges = [tuple(m.split(" ", 1)) for m in gf.require("tokenizer.ggml.merges")]
    bpe = models.BPE(vocab=_vocab(tokens, types), merges=merges, fuse_unk=False)
    backend = tokenizers.Tokenizer(bpe)
    # tokenizer.ggml.add_space_prefix is a SentencePiece setting; llama.cpp and transformers both
    # ignore it for byte-level BPE, so it is not read here.
    backend.pre_tokenizer = _pre_tokenizer(str(gf.get("tokenizer.ggml.pre", "default")), gf.path)
    backend.decoder = decoders.ByteLevel()

    special = [i for i, t in enumerate(types) if t == _CONTROL]
    user = [i for i, t in enumerate(types) if t == _USER_DEFINED]
    backend.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in special]
    )
    backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])
    for i in special + user:
        if backend.token_to_id(tokens[i]) != i:
            raise ValueError(f"{gf.path}: special token {tokens[i]!r} (id {i}) is not unique")
    return backend


class _Vocabulary(NamedTuple):
    build: Callable[[GGUFFile], tokenizers.Tokenizer]
    byte_level: bool  # pieces spelled in GPT-2's byte alphabet (Tokenizer.token_bytes)
    add_bos_default: bool  # when tokenizer.ggml.add_bos_token is absent


VOCABULARIES: Mapping[str, _Vocabulary] = MappingProxyType(
    {
        "gpt2": _Vocabulary(byte_level_backend, byte_level=True, add_bos_default=False),
        "llama": _Vocabulary(spm_backend, byte_level=False, add_bos_default=True),
    }
)


def gguf_tokenizer(gf: GGUFFile) -> Tokenizer:
    """tandem's ``Tokenizer`` for the vocabulary, special tokens and chat template of ``gf``."""
    model = gf.require("tokenizer.ggml.model")
    vocabulary = VOCABULARIES.get(model)
    if vocabulary is None:
        raise ValueError(
            f"{gf.path}: unsupported tokenizer.ggml.model {model!r}; tandem reads byte-level BPE "
            "('gpt2') and SentencePiece BPE ('llama') tokenizers from GGUF"
        )
    backend: tokenizers.Tokenizer = _backends.get(gf.key, lambda: vocabulary.build(gf))  # see the module docstring
    architecture = str(gf.get("general.architecture", ""))

    def token_id(key: str) -> int | None:
        value = gf.get(f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    eos = token_id("eos_token_id")
    stops = {token_id(k) for k in ("eos_token_id", "eot_token_id", "eom_token_id")}
    if architecture in GEMMA_FAMILY:
        stops.add(backend.token_to_id("<end_of_turn>"))
    specials = SpecialTokens(
        bos_token_id=token_id("bos_token_id"),
        eos_token_id=eos,
        eos_token_ids=frozenset(i for i in stops if i is not None),
        pad_token_id=token_id("padding_token_id"),
        unk_token_id=token_id("unknown_token_id"),
        add_bos=bool(gf.get("tokenizer.ggml.add_bos_token", vocabulary.add_bos_default)),
        add_eos=bool(gf.get("tokenizer.ggml.add_eos_token", False)),
    )
    template = gf.get("tokenizer.chat_template")
    origin = f"{gf.path}: tokenizer.chat_template"
    if not template and architecture in DEFAULT_CHAT_TEMPLATES:
        template = DEFAULT_CHAT_TEMPLATES[architecture]
        origin = f"{gf.path}: tandem's default {architecture} chat template (the file has none)"
    chat = ChatTemplate(template, origin) if template else None
    return Tokenizer(backend, specials, chat, byte_level=vocabulary.byte_level, name=str(gf.path))
