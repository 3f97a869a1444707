"""Prompt lookup: the most recent earlier occurrence of the longest suffix n-gram wins."""

from __future__ import annotations

import torch

from tandem.spec_decode.ngram import propose_ngram


def t(xs):
    return torch.tensor(xs, dtype=torch.int64)


def test_longest_suffix_most_recent_occurrence():
    ctx = t([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3])
    # suffix (2,3) occurred at 1 and 5 -> most recent (5) -> continuation 7, 8, 5
    assert propose_ngram([ctx], 1, 4, [3]) == [[7, 8, 5]]
    # a longer n-gram beats a more recent shorter one
    ctx = t([4, 5, 6, 11, 12, 0, 6, 13, 4, 5, 6])
    assert propose_ngram([ctx], 1, 3, [2]) == [[11, 12]]
    assert propose_ngram([ctx], 1, 1, [2]) == [[13, 4]]  # only unigrams: last earlier 6 is at 6


def test_no_match_min_n_and_limits():
    ctx = t([1, 2, 3, 4])
    assert propose_ngram([ctx], 1, 3, [3]) == [[]]
    ctx = t([7, 8, 7])
    assert propose_ngram([ctx], 2, 3, [3]) == [[]]  # only a unigram match exists
    assert propose_ngram([ctx], 1, 3, [3]) == [[8, 7]]  # continuation runs into the suffix, then ends
    assert propose_ngram([ctx], 1, 3, [0]) == [[]]  # max_drafts caps


def test_batched_ragged_contexts_equal_one_by_one():
    g = torch.Generator().manual_seed(0)
    ctxs = [torch.randint(0, 5, (n,), generator=g) for n in (1, 3, 17, 40, 2)]
    batched = propose_ngram(ctxs, 1, 4, [3] * 5)
    single = [propose_ngram([c], 1, 4, [3])[0] for c in ctxs]
    assert batched == single
