"""tandem's tokenizer: a ``tokenizers.Tokenizer`` plus the model's special-token rules and chat
template, with the same observable behaviour as the Hugging Face tokenizer of the same files.

Who adds BOS/EOS: for GGUF files (and HF directories whose ``tokenizer_config.json`` states
``add_bos_token`` / ``add_eos_token``) the backend has no post-processor and this class adds them
according to the flags; otherwise the ``tokenizer.json`` post-processor decides, as in transformers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tokenizers

from tandem.model.loader.chat_template import ChatTemplate


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character map used by byte-level BPE vocabularies: printable Latin-1
    bytes stand for themselves, the other 68 bytes get the code points 256, 257, ... in order."""
    table = {b: chr(b) for b in [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]}
    shifted = (b for b in range(256) if b not in table)
    table |= {b: chr(256 + n) for n, b in enumerate(shifted)}
    return table


@dataclass(frozen=True)
class SpecialTokens:
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Every id that ends generation: eos_token_id plus generation_config / GGUF end-of-turn ids.
    eos_token_ids: frozenset[int] = frozenset()
    pad_token_id: int | None = None
    unk_token_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    # True: the backend's post-processor adds special tokens (see the module docstring).
    backend_post_processor: bool = False


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        specials: SpecialTokens,
        chat_template: ChatTemplate | None = None,
        *,
        byte_level: bool = True,
        name: str = "tokenizer",
    ) -> None:
        self.backend = backend
        self.specials = specials
        self.chat_template = chat_template
        self.byte_level = byte_level
        self.name = name
        added = backend.get_added_tokens_decoder()
        self._added_ids = frozenset(added)
        named = (specials.bos_token_id, specials.eos_token_id, specials.pad_token_id)
        special = {i for i, tok in added.items() if tok.special}
        special |= {i for i in (*named, specials.unk_token_id) if i is not None}
        self.all_special_ids: tuple[int, ...] = tuple(sorted(special))
        self._token_bytes: list[bytes] | None = None  # built on first token_bytes() call

    # ----------------------------------------------------------------- properties
    @property
    def bos_token_id(self) -> int | None:
        return self.specials.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self.specials.eos_token_id

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.specials.eos_token_ids

    @property
    def pad_token_id(self) -> int | None:
        return self.specials.pad_token_id

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def _token_text(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(token_id)

    @property
    def bos_token(self) -> str | None:
        return self._token_text(self.specials.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return self._token_text(self.specials.eos_token_id)

    # ----------------------------------------------------------------- encode / decode
    def _add_specials(self, ids: list[int]) -> list[int]:
        s = self.specials
        if s.add_bos and s.bos_token_id is not None:
            ids.insert(0, s.bos_token_id)
        if s.add_eos and s.eos_token_id is not None:
            ids.append(s.eos_token_id)
        return ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.specials.backend_post_processor:
            return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)
        ids = list(self.backend.encode(text, add_special_tokens=False).ids)
        return self._add_specials(ids) if add_special_tokens else ids

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        """``encode`` for many texts at once (the backend parallelises across texts)."""
        if self.specials.backend_post_processor:
            encs = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
            return [list(e.ids) for e in encs]
        encs = self.backend.encode_batch(list(texts), add_special_tokens=False)
        ids = [list(e.ids) for e in encs]
        return [self._add_specials(i) for i in ids] if add_special_tokens else ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> Any:
        """The vocabulary string of one id (``str``) or of each id (``list[str]``)."""
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token ``token_id`` stands for (added tokens: their UTF-8 text)."""
        if self._token_bytes is None:
            self._token_bytes = self._build_token_bytes()
        return self._token_bytes[token_id]

    def _build_token_bytes(self) -> list[bytes]:
        table = [b""] * self.vocab_size
        inverse = {c: b for b, c in byte_alphabet().items()}
        for token, token_id in self.backend.get_vocab(with_added_tokens=True).items():
            if token_id in self._added_ids:
                table[token_id] = token.encode("utf-8")
            elif self.byte_level and all(c in inverse for c in token):
                table[token_id] = bytes(inverse[c] for c in token)
            elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                table[token_id] = bytes([int(token[3:5], 16)])  # sentencepiece byte fallback
            else:
                table[token_id] = token.replace("\u2581", " ").encode("utf-8")
        return table

    # ----------------------------------------------------------------- chat
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        chat_template: ChatTemplate | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for a conversation with the model's template (or ``chat_template``); extra keyword
        arguments become template variables."""
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError(f"{self.name}: the model has no chat template (pass one: chat_template / --chat-template)")
        variables: dict[str, Any] = {"tools": None, "documents": None}
        for key, token_id in (
            ("bos_token", self.specials.bos_token_id),
            ("eos_token", self.specials.eos_token_id),
            ("pad_token", self.specials.pad_token_id),
            ("unk_token", self.specials.unk_token_id),
        ):
            if token_id is not None:
                variables[key] = self.backend.id_to_token(token_id)
        variables.update(kwargs)
        return template.render(messages, add_generation_prompt=add_generation_prompt, variables=variables)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"
