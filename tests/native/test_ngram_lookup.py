"""N-gram prompt lookup in C (native/ngram_lookup.c) against the torch reference (propose_ngram), built for every
ISA variant this machine runs: the same drafts for random histories with repeats, every n range, draft cap and
window; and the kernel's own checks."""

from __future__ import annotations

import pytest
import torch

from tandem import native
from tandem.native.ngram_lookup import NgramLookupKernel, ngram_lookup_kernel
from tandem.spec_decode.ngram import propose_ngram

KERNEL = ngram_lookup_kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="native kernels unavailable (no C compiler)")
ISAS = native.runnable_isas()


def _table(rows: int, width: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A token table of ``rows`` histories over a small vocabulary (so n-grams repeat), lengths 0 .. width - 1;
    the columns past a row's length hold junk, as the runner's table may."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (rows, width), generator=g)
    lengths = torch.randint(0, width, (rows,), generator=g)
    lengths[0], lengths[-1] = width - 1, 1
    return tokens, lengths


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("min_n", "max_n", "k"), [(1, 1, 3), (1, 3, 3), (2, 4, 5), (3, 3, 1), (1, 5, 8)])
def test_the_kernel_drafts_what_the_reference_drafts(isa, seed, min_n, max_n, k):
    kernel = NgramLookupKernel(native.load("ngram_lookup", isa))
    tokens, lengths = _table(12, 40, 3 + seed, seed)
    slots = torch.tensor([11, 0, 3, 7, 5, 2, 9])
    g = torch.Generator().manual_seed(100 + seed)
    max_drafts = torch.randint(0, k + 2, (len(slots),), generator=g)
    for width in (int(lengths[slots].max()), 39):  # the host's bound on the contexts, the table's
        ref = propose_ngram(tokens.index_select(0, slots)[:, :width], lengths[slots], min_n, max_n, max_drafts, k)
        got = kernel(tokens, lengths, slots, width, min_n, max_n, max_drafts, k)
        assert torch.equal(got, ref), (width, got, ref)


def test_a_repeated_phrase_is_continued_from_its_latest_occurrence():
    seq = [5, 6, 7, 1, 5, 6, 7, 2, 9, 5, 6, 7]
    tokens = torch.tensor([seq + [0] * 4])
    got = KERNEL(tokens, torch.tensor([len(seq)]), torch.tensor([0]), len(seq), 1, 3, torch.tensor([3]), 3)
    assert got.tolist() == [[2, 9, 5]]  # "5 6 7" last seen before "2 9 5", not before "1"
    got = KERNEL(tokens, torch.tensor([len(seq)]), torch.tensor([0]), len(seq), 1, 3, torch.tensor([1]), 3)
    assert got.tolist() == [[2, -1, -1]]  # the request's cap


def test_the_kernel_refuses_what_it_cannot_read():
    tokens = torch.zeros(2, 8, dtype=torch.int64)
    ok = (torch.tensor([3, 3]), torch.tensor([1]), 8, 1, 3, torch.tensor([3]), 3)
    assert KERNEL(tokens, *ok).shape == (1, 3)
    with pytest.raises(ValueError, match="slot outside"):
        KERNEL(tokens, torch.tensor([3, 3]), torch.tensor([2]), 8, 1, 3, torch.tensor([3]), 3)
    with pytest.raises(ValueError, match="longer than the window"):
        KERNEL(tokens, torch.tensor([3, 6]), torch.tensor([1]), 5, 1, 3, torch.tensor([3]), 3)
    with pytest.raises(ValueError, match="ngram lookup"):
        KERNEL(tokens.int(), *ok)
    with pytest.raises(ValueError, match="ngram lookup"):
        KERNEL(tokens, torch.tensor([3, 3]), torch.tensor([1]), 8, 3, 1, torch.tensor([3]), 3)
