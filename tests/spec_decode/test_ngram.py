"""Prompt lookup on the device: the most recent earlier occurrence of the longest suffix n-gram wins."""

from __future__ import annotations

import torch

from tandem.spec_decode.ngram import propose_ngram


def run(ctxs, min_n, max_n, max_drafts, k=3):
    width = max(len(c) for c in ctxs) + 2
    tokens = torch.zeros(len(ctxs), width, dtype=torch.int64)
    for i, c in enumerate(ctxs):
        tokens[i, : len(c)] = torch.tensor(c)
    lengths = torch.tensor([len(c) for c in ctxs])
    out = propose_ngram(tokens, lengths, min_n, max_n, torch.tensor(max_drafts), k)
    return [[t for t in row if t >= 0] for row in out.tolist()]


def test_longest_suffix_most_recent_occurrence():
    # suffix (2,3) occurred at 1 and 5 -> most recent (5) -> continuation 7, 8, 5
    assert run([[1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]], 1, 4, [3]) == [[7, 8, 5]]
    ctx = [4, 5, 6, 11, 12, 0, 6, 13, 4, 5, 6]
    assert run([ctx], 1, 3, [2]) == [[11, 12]]  # a longer n-gram beats a more recent shorter one
    assert run([ctx], 1, 1, [2]) == [[13, 4]]  # only unigrams: the last earlier 6 is at index 6


def test_no_match_min_n_and_limits():
    assert run([[1, 2, 3, 4]], 1, 3, [3]) == [[]]
    assert run([[7, 8, 7]], 2, 3, [3]) == [[]]  # only a unigram match exists
    assert run([[7, 8, 7]], 1, 3, [3]) == [[8, 7]]  # continuation runs into the suffix, then ends
    assert run([[7, 8, 7]], 1, 3, [0]) == [[]]  # max_drafts caps
    assert run([[7, 8, 7, 8, 7]], 1, 3, [1]) == [[8]]


def test_batched_ragged_contexts_equal_one_by_one():
    g = torch.Generator().manual_seed(0)
    ctxs = [torch.randint(0, 5, (n,), generator=g).tolist() for n in (1, 3, 17, 40, 2)]
    batched = run(ctxs, 1, 4, [3] * 5)
    single = [run([c], 1, 4, [3])[0] for c in ctxs]
    assert batched == single
