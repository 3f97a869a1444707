"""Bad words: tokenization into sequences (with and without a leading space), the per-row ban rule
(prefix match on the row's context, placeholders never match), and the sampler applying it on
verify rows whose contexts differ by their draft prefix."""

from __future__ import annotations

import torch

from tandem.sample import RejectionSampler, RowSpec, Sampler, SamplingMetadata
from tandem.sample.bad_words import banned_tokens, tokenize_bad_words
from tandem.sampling_params import SamplingParams

# A toy word-level vocabulary: "foo" alone is one token, " foo" another, "bar baz" two tokens.
_VOCAB = {"foo": 1, " foo": 2, "bar": 3, " bar": 4, " baz": 5, "x": 6}


def _encode(text: str) -> list[int]:
    out, i = [], 0
    while i < len(text):
        for tok, tid in sorted(_VOCAB.items(), key=lambda kv: -len(kv[0])):
            if text.startswith(tok, i):
                out.append(tid)
                i += len(tok)
                break
        else:
            raise ValueError(text[i:])
    return out


def test_tokenize_with_and_without_leading_space() -> None:
    words = tokenize_bad_words(["foo", " bar baz", "foo"], _encode)
    assert words == ((1,), (2,), (3, 5), (4, 5))


def test_single_token_words_always_banned() -> None:
    assert banned_tokens([], ((1,), (2,))) == [1, 2]
    assert banned_tokens([6, 6], ((1,),)) == [1]


def test_multi_token_word_banned_after_its_prefix_only() -> None:
    words = ((3, 5), (4, 5), (6, 6, 1))
    assert banned_tokens([6, 3], words) == [5]
    assert banned_tokens([6, 4], words) == [5]
    assert banned_tokens([3, 6], words) == []
    assert banned_tokens([6, 6], words) == [1]
    assert banned_tokens([6], words) == []  # context shorter than the prefix
    assert banned_tokens(torch.tensor([2, 3]), words) == [5]


def test_placeholders_never_match() -> None:
    words = ((3, 5), (6, 6, 1))
    assert banned_tokens([3, -1], words) == []
    assert banned_tokens([-1, 6], words) == []
    assert banned_tokens([6, -1, 6], words) == []


def test_sampler_bans_last_token_per_row_context() -> None:
    vocab = 8
    params = SamplingParams(temperature=0.0, bad_words=["bar baz"])
    words = tokenize_bad_words(params.bad_words, _encode)
    logits = torch.zeros(3, vocab)
    logits[:, 5] = 10.0  # " baz" is everyone's favourite
    logits[:, 6] = 5.0
    rows = [
        RowSpec(params, [0], [6], seed=0, position=1, bad_words_token_ids=words),
        RowSpec(params, [0], [6, 3], seed=0, position=2, bad_words_token_ids=words),
        RowSpec(params, [0], [6, -1], seed=0, position=2, bad_words_token_ids=words),
    ]
    meta = SamplingMetadata.build(rows, vocab, "cpu")
    assert meta.bad_words_ban is not None
    out = Sampler()(logits, meta).sampled_token_ids.tolist()
    assert out == [5, 6, 5]


def test_verify_rows_use_draft_prefix_as_context() -> None:
    # Drafts [3, 5]: row 1's context ends with draft 3, so " baz" (5) is banned there and the draft
    # is rejected; the recovered token is the next best (6).
    vocab = 8
    params = SamplingParams(temperature=0.0, bad_words=["bar baz"])
    words = tokenize_bad_words(params.bad_words, _encode)
    logits = torch.zeros(3, vocab)
    logits[0, 3] = 10.0
    logits[1, 5] = 10.0
    logits[1, 6] = 5.0
    logits[2, 6] = 10.0
    committed = [6]
    drafts = [3, 5]
    rows = [
        RowSpec(params, [0], committed + drafts[:j], seed=0, position=1 + j,
                bad_words_token_ids=words)
        for j in range(3)
    ]
    meta = SamplingMetadata.build(rows, vocab, "cpu")
    out = RejectionSampler()(logits, meta, torch.tensor([drafts]), [2]).output_token_ids
    assert out.tolist() == [[3, 6, -1]]


def test_no_bad_words_no_ban_tensor() -> None:
    rows = [RowSpec(SamplingParams(), [0], [1], seed=0, position=1)]
    assert SamplingMetadata.build(rows, 4, "cpu").bad_words_ban is None
