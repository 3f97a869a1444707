"""SentencePiece-style GGUF vocabularies (``tokenizer.ggml.model = "llama"``) against transformers'
tokenizer built from the same file: identical ids and text on Gemma 3 270M for 1,217 generated
strings and 400 random id sequences, raw token bytes, streaming detokenization across byte-fallback
pieces, the default Gemma chat template, and tiny synthetic files for the non-Gemma rules.

The one known difference, tested below: outside the Gemma family transformers ignores
``tokenizer.ggml.add_space_prefix = false`` and prepends "▁" anyway; tandem honours the flag, as
llama.cpp does.
"""

from __future__ import annotations

import importlib.util
import random
import time
from pathlib import Path
from typing import Any

import gguf
import pytest

from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.engine.prompts import normalize_prompts
from tandem.model.loader import KNOWN_MODELS, Tokenizer, load_tokenizer, resolve_model
from tandem.model.loader.chat_template import GEMMA_CHAT_TEMPLATE, ChatTemplate
from tandem.model.loader.gguf_file import GGUFFile
from tandem.model.loader.tokenizer_gguf import gguf_tokenizer
from tandem.model.loader.tokenizer_spm import spm_backend, spm_merges
from tests.hf_reference import hf_tokenizer

transformers = pytest.importorskip("transformers")

GEMMA = "gemma-3-270m"
BOS, EOS, START_OF_TURN, END_OF_TURN = 2, 1, 105, 106
BYTE_TOKENS = range(238, 494)  # <0x00> .. <0xFF>
SPACE_RUNS = range(138, 168)  # "  " .. 31 spaces, stored as real spaces, respelled "▁▁".."

# ---------------------------------------------------------------------------- generated strings
CODE = [
    "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n",
    '    """ Check if in given list of numbers, are any two numbers closer than threshold.\n',
    "    >>> separate_paren_groups('( ) (( )) (( )( ))')\n    ['()', '(())', '(()())']\n",
    "from typing import List, Optional\n\n\ndef longest(strings: List[str]) -> Optional[str]:",
    "    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in enumerate(numbers):",
    "\t\treturn [x for x in range(n) if x % 2 == 0]\n",
    "if __name__ == '__main__':\n    main()",
    "x = {'a': 1, \"b\": [2, 3.5e-7], 'c': None}  # comment",
    "class Foo(Bar):\n    def __init__(self, *args, **kwargs) -> None:\n        super().__init__()",
    "int main(void) { printf(\"%d\\n\", 42); return 0; }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"x\"><b>bold</b> <table><tr><td>1</td></tr></table></div>",
    "λx. x + 1 ≠ ∑ᵢ xᵢ² ≤ ∞ ∀ε>0 ∃δ",
    "0 12 345 6789 3.14159 -42 1e-9 0xFF 1_000_000",
]
SCRIPTS = [
    "日本語のテキストです。",
    "中文字符测试，你好世界！",
    "한국어 문장입니다",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया, हिन्दी",
    "สวัสดีชาวโลก",
    "Привет, мир! Ёжик",
    "Γειά σου Κόσμε",
    "héllo wörld naïve café façade Ångström ŒUVRE",
    "e\u0301 a\u0308 n\u0303 combining marks",
    "ǅemal ǈ ǋ titlecase digraphs",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
]
EMOJI = [
    "🤗",
    "🎉🎉",
    "👍🏽",
    "🧑🏿\u200d💻",
    "👨\u200d👩\u200d👧\u200d👦",
    "🏳️\u200d🌈",
    "🇫🇷🇯🇵",
    "1️⃣",
    "❤️",
    "🫠",
]
RARE = [  # characters without a piece of their own: byte fallback
    "𐀀",
    "ᚠᚢᚦ",
    "⠁⠃⠉",
    "ꙮ",
    "𓀀𓀁",
    "\U0010fffd",
    "\x00",
    "\u2028",
    "\ue000",
    "\x01\x7f",
    "\ufffd",
]
SPECIAL = [
    "<bos>",
    "<eos>",
    "<pad>",
    "<mask>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_turn>user\n",
    "<start_of_image>",
    "<end_of_image>",
    "[multimodal]",
    "<unused0>",
    "<unused6241>",
    "<s>",
    "</s>",
    "<0x41>",
    "<0xZZ>",
    "▁",
    "▁▁hi",
    "<start_of_turn",
    "end_of_turn>",
    "< bos>",
    "<BOS>",
]
WORDS = ["hello", "world", "The", "quick", "brown", "fox", "tokenizer", "I'm", "don't", "a", "Z"]
SPACES = ["", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\n    "]
SPACES += ["\u00a0", "\u3000"]
POOLS = [CODE, SCRIPTS, EMOJI, RARE, SPECIAL, WORDS]
FIXED = [
    "",
    " ",
    "   ",
    "\n",
    "\t",
    "hello world",
    " hello",
    "hello ",
    "  leading and trailing  ",
    "a\n\n\nb\n\n\n\n",
    "\t\tindented\t\t",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos><bos><eos>",
    "x" * 300,
    " " * 40,
    "\n" * 40,
    "\t" * 40,
]


def generated_strings(count: int, seed: int = 0) -> list[str]:
    """``FIXED`` plus ``count`` seeded compositions of pieces from the pools, joined by whitespace
    runs, with whitespace before and after; some pieces are cut at a random character."""
    rng = random.Random(seed)
    out = list(FIXED)
    for _ in range(count):
        pieces = []
        for _ in range(rng.randint(1, 6)):
            piece = rng.choice(rng.choice(POOLS))
            if rng.random() < 0.1 and len(piece) > 1:
                cut = rng.randrange(1, len(piece))
                piece = piece[:cut] if rng.random() < 0.5 else piece[cut:]
            pieces.append(piece)
        text = "".join(p + rng.choice(SPACES) for p in pieces)
        out.append(rng.choice(SPACES) * rng.randint(0, 2) + text)
    return out


STRINGS = generated_strings(1200)


# ---------------------------------------------------------------------------- fixtures
def _gemma_path() -> Path:
    if importlib.util.find_spec(KNOWN_MODELS[GEMMA].package) is None:
        requirement = KNOWN_MODELS[GEMMA].requirement
        pytest.skip(f"the Gemma 3 270M package is not installed ({requirement})")
    return resolve_model(GEMMA)


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    return _gemma_path()


@pytest.fixture(scope="module")
def tok(gemma_path: Path) -> Tokenizer:
    gf = GGUFFile.open(gemma_path)
    start = time.perf_counter()
    spm_backend(gf)  # built anew: gguf_tokenizer may hand out a backend already built in this process
    # About 2 s (1.2 s of it deriving 514,906 merges); the bound only catches a quadratic slip.
    assert time.perf_counter() - start < 30
    return gguf_tokenizer(gf)


@pytest.fixture(scope="module")
def ref(gemma_path: Path) -> Any:
    return hf_tokenizer(gemma_path)


def _first_differences(ours: list[Any], theirs: list[Any], inputs: list[Any]) -> list[str]:
    return [f"{x!r}: {a} != {b}" for x, a, b in zip(inputs, ours, theirs) if a != b][:5]


# ---------------------------------------------------------------------------- Gemma vs transformers
@pytest.mark.slow
def test_vocabulary_and_special_tokens(tok: Tokenizer, ref: Any) -> None:
    assert tok.vocab_size == len(ref) == 262144
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS, EOS, 0)
    assert (tok.bos_token, tok.eos_token) == ("<bos>", "<eos>") == (ref.bos_token, ref.eos_token)
    assert tok.specials.add_bos and not tok.specials.add_eos
    assert tok.eos_token_ids == {EOS, END_OF_TURN}  # <end_of_turn> ends a Gemma turn
    assert not tok.byte_level
    added = tok.backend.get_added_tokens_decoder()
    ref_added = ref.backend_tokenizer.get_added_tokens_decoder()
    assert {i: (t.content, t.special) for i, t in added.items()} == {
        i: (t.content, t.special) for i, t in ref_added.items()
    }
    assert set(ref.all_special_ids) <= set(tok.all_special_ids)
    sample = list(range(0, 262144, 97))
    assert tok.convert_ids_to_tokens(sample) == ref.convert_ids_to_tokens(sample)


@pytest.mark.slow
def test_merges_are_transformers_merges(gemma_path: Path, ref: Any) -> None:
    import json

    model = json.loads(ref.backend_tokenizer.to_str())["model"]
    theirs = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    start = time.perf_counter()
    ours = spm_merges(tokens, range(0, -len(tokens), -1))
    elapsed = time.perf_counter() - start
    assert ours == theirs
    assert elapsed < 20  # about 1.2 s


@pytest.mark.slow
def test_generated_strings_match_transformers(tok: Tokenizer, ref: Any) -> None:
    assert len(STRINGS) >= 1000
    for add_special_tokens in (True, False):
        ours = tok.encode_batch(STRINGS, add_special_tokens=add_special_tokens)
        theirs = ref(STRINGS, add_special_tokens=add_special_tokens)["input_ids"]
        assert ours == theirs, _first_differences(ours, theirs, STRINGS)
        assert ours == [tok.encode(s, add_special_tokens=add_special_tokens) for s in STRINGS]
    ids = tok.encode_batch(STRINGS)
    for skip in (True, False):
        ours_text = [tok.decode(i, skip_special_tokens=skip) for i in ids]
        theirs_text = ref.batch_decode(ids, skip_special_tokens=skip)
        assert ours_text == theirs_text, _first_differences(ours_text, theirs_text, STRINGS)
    # With no prefix space and byte fallback, decoding gives back every string exactly, except
    # that a "▁" in the text comes back as a space.
    texts = [s for s in STRINGS if "▁" not in s]
    roundtrip = [tok.decode(i, skip_special_tokens=False) for i in tok.encode_batch(texts, False)]
    assert roundtrip == texts


@pytest.mark.slow
def test_random_id_sequences_decode_like_transformers(tok: Tokenizer, ref: Any) -> None:
    rng = random.Random(1)
    special = [0, 1, 2, 3, 4, 5, 105, 106, 107, 108, 255968, 255999, 262143]
    sequences = []
    for n in range(400):
        length = rng.randint(1, 24)
        if n % 4 == 0:  # mostly byte pieces: valid, truncated and invalid UTF-8
            seq = [rng.choice(BYTE_TOKENS) for _ in range(length)]
        elif n % 4 == 1:
            seq = [rng.choice([*BYTE_TOKENS, *special, *SPACE_RUNS]) for _ in range(length)]
        else:
            seq = [rng.randrange(tok.vocab_size) for _ in range(length)]
        sequences.append(seq)
    for skip in (True, False):
        ours = [tok.decode(s, skip_special_tokens=skip) for s in sequences]
        theirs = ref.batch_decode(sequences, skip_special_tokens=skip)
        assert ours == theirs, _first_differences(ours, theirs, sequences)


# ---------------------------------------------------------------------------- raw token bytes
@pytest.mark.slow
def test_token_bytes(tok: Tokenizer) -> None:
    for byte, token_id in zip(range(256), BYTE_TOKENS, strict=True):
        assert tok.convert_ids_to_tokens(token_id) == f"<0x{byte:02X}>"
        assert tok.token_bytes(token_id) == bytes([byte])
    space = tok.token_to_id("▁")
    assert space is not None and tok.token_bytes(space) == b" "
    assert tok.token_bytes(tok.encode("▁the", add_special_tokens=False)[0]) == b" the"
    for n, token_id in enumerate(SPACE_RUNS, start=2):
        assert tok.token_bytes(token_id) == b" " * n
    assert tok.token_bytes(START_OF_TURN) == b"<start_of_turn>"
    assert tok.token_bytes(BOS) == b"<bos>"
    assert tok.token_bytes(107) == b"\n"
    assert tok.token_bytes(255999) == b"<start_of_image>"
    # Concatenated, the pieces' bytes spell the text ("▁" in the text itself aside: it becomes a
    # space piece).
    texts = [s for s in STRINGS if "▁" not in s]
    for text, ids in zip(texts, tok.encode_batch(texts, add_special_tokens=False), strict=True):
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8"), text


# ---------------------------------------------------------------------------- streaming
@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_streaming_across_byte_fallback_pieces(tok: Tokenizer, ref: Any, chunk: int) -> None:
    text = " Hi 🤗! 日本語 ᚠᚢᚦ 𓀀 family 👨\u200d👩\u200d👧 ok 🧑🏿\u200d💻 ꙮ 中文<end_of_turn>\n" * 3
    ids = tok.encode(text, add_special_tokens=False)
    # The text really splits characters over several byte pieces.
    assert sum(i in BYTE_TOKENS for i in ids) >= 12
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Say hi"}]), False)
    for skip in (True, False):
        detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
        deltas = [detok.add_tokens(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
        deltas.append(detok.finish())
        full = tok.decode(ids, skip_special_tokens=skip)
        assert "".join(deltas) == detok.text == full == ref.decode(ids, skip_special_tokens=skip)
        assert not any("\ufffd" in d for d in deltas)
        assert deltas[-1] == ""


# ---------------------------------------------------------------------------- chat template
CONVERSATIONS: list[tuple[list[dict[str, Any]], str]] = [
    (
        [{"role": "user", "content": "Hi"}],
        "<bos><start_of_turn>user\nHi<end_of_turn>\n",
    ),
    (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "  Write a haiku.\n"},
        ],
        "<bos><start_of_turn>user\nYou are terse.\n\nWrite a haiku.<end_of_turn>\n",
    ),
    (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Say 🤗 in 日本語"},
        ],
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello! How can I help?<end_of_turn>\n"
        "<start_of_turn>user\nSay 🤗 in 日本語<end_of_turn>\n",
    ),
    (
        [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": " Describe "}, {"type": "image"}],
            },
        ],
        "<bos><start_of_turn>user\nBe brief.\n\nDescribe<start_of_image><end_of_turn>\n",
    ),
]


@pytest.mark.parametrize(("messages", "expected"), CONVERSATIONS)
def test_gemma_chat_template_renders_the_turn_format(
    messages: list[dict[str, Any]], expected: str
) -> None:
    template = ChatTemplate(GEMMA_CHAT_TEMPLATE)
    variables = {"bos_token": "<bos>"}
    assert template.render(messages, add_generation_prompt=False, variables=variables) == expected
    prompt = template.render(messages, add_generation_prompt=True, variables=variables)
    assert prompt == expected + "<start_of_turn>model\n"


def test_gemma_chat_template_rejects_roles_out_of_turn() -> None:
    template = ChatTemplate(GEMMA_CHAT_TEMPLATE)
    with pytest.raises(ValueError, match="must alternate"):
        template.render([{"role": "assistant", "content": "Hi"}], variables={"bos_token": "<bos>"})


@pytest.mark.slow
def test_chat_prompt_has_one_bos(tok: Tokenizer, ref: Any) -> None:
    assert tok.chat_template is not None and "default gemma3" in tok.chat_template.origin
    messages = CONVERSATIONS[2][0]
    text = tok.apply_chat_template(messages)
    assert text == CONVERSATIONS[2][1] + "<start_of_turn>model\n"
    # The engine encodes a rendered chat with add_special_tokens=False (LLM.chat, the CLI and the
    # OpenAI server): the template's <bos> is then the only one.
    (prompt,) = normalize_prompts([{"prompt": text, "add_special_tokens": False}])
    ids = prompt.token_ids(tok)
    assert ids == ref.encode(text, add_special_tokens=False)
    assert ids[0] == BOS and ids.count(BOS) == 1
    assert ids.count(START_OF_TURN) == 4 and ids.count(END_OF_TURN) == 3
    # Encoding it as plain text would add a second BOS, as transformers does too.
    assert tok.encode(text)[:2] == ref.encode(text)[:2] == [BOS, BOS]


# ---------------------------------------------------------------------------- synthetic files
PIECES = ["▁", "a", "b", "c", "e", "h", "i", "l", "o", "▁h", "▁a", "ab", "▁ab", "hi", "▁hi"]
PIECES += ["ll", "he", "hell", "hello", "▁hello", "bc", "abc", "▁abc", "  "]
SYNTH_TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *PIECES]
SYNTH_TOKENS += ["<ctl>", "<user>"]
SYNTH_TYPES = [2, 3, 3, *[6] * 256, *[1] * (len(PIECES) - 1), 4, 3, 4]
SYNTH_SCORES = [0.0] * 259 + [-float(i) for i in range(len(PIECES))] + [0.0, 0.0]
SYNTH_TEXTS = [
    "",
    " ",
    "hello",
    " hello",
    "  hello  ",
    "hi abc",
    "a<s>hello",
    "<s>hello world",
    "héllo ☃",
    "abc<ctl> abc<user>abc",
    "\n hi\t",
    "<unk> x",
    "a   b",
]


def write_spm_gguf(
    path: Path,
    arch: str,
    *,
    add_space_prefix: bool | None = None,
    template: str | None = None,
    model: str = "llama",
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model(model)
    w.add_token_list(SYNTH_TOKENS)
    w.add_token_types(SYNTH_TYPES)
    w.add_token_scores(SYNTH_SCORES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_synthetic_vocabulary_matches_transformers(tmp_path: Path, arch: str) -> None:
    # llama: "▁" before the text's start only, stripped again on decode, ranked by score;
    # gemma3: add_space_prefix false, ranked by position, "  " respelled "▁▁" (elsewhere it is a
    # user-defined token, matched whole).
    prefix = None if arch == "llama" else False
    path = write_spm_gguf(tmp_path / "t.gguf", arch, add_space_prefix=prefix)
    tok = load_tokenizer(path)
    ref = hf_tokenizer(path)
    for text in SYNTH_TEXTS:
        for add_special_tokens in (True, False):
            ids = tok.encode(text, add_special_tokens=add_special_tokens)
            assert ids == ref.encode(text, add_special_tokens=add_special_tokens), text
        for skip in (True, False):
            ours = tok.decode(ids, skip_special_tokens=skip)
            assert ours == ref.decode(ids, skip_special_tokens=skip), text
    assert tok.encode("hello")[0] == 1  # add_bos_token absent: on for SentencePiece vocabularies
    assert tok.chat_template is not None if arch == "gemma3" else tok.chat_template is None


def test_add_space_prefix_false_is_honoured_outside_gemma(tmp_path: Path) -> None:
    # transformers' LlamaTokenizer prepends "▁" whatever the file says; llama.cpp and tandem don't.
    path = write_spm_gguf(tmp_path / "t.gguf", "llama", add_space_prefix=False)
    tok = load_tokenizer(path)
    ids = tok.encode("hi abc", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["hi", "▁abc"]
    assert tok.decode(tok.encode(" hi abc")) == " hi abc"
    ref = hf_tokenizer(path)
    ids = ref.encode("hi abc", add_special_tokens=False)
    assert ref.convert_ids_to_tokens(ids) == ["▁hi", "▁abc"]


def test_file_chat_template_wins_over_the_default(tmp_path: Path) -> None:
    path = write_spm_gguf(tmp_path / "t.gguf", "gemma3", template="{{ messages[0]['content'] }}")
    tok = load_tokenizer(path)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi"


def test_unsupported_tokenizer_model_is_named(tmp_path: Path) -> None:
    path = write_spm_gguf(tmp_path / "t.gguf", "bert", model="bert")
    with pytest.raises(ValueError, match=r"unsupported tokenizer\.ggml\.model 'bert'"):
        load_tokenizer(path)
