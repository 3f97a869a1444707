"""The native suffix index (native/suffix_index.c) against the Python reference (spec_decode/suffix.py): the same
contents after additions and removals, the same drafts at every step of many requests sharing a global index
that evicts, for every ISA variant this CPU runs; and a table that keeps evicting stays bounded."""

from __future__ import annotations

import random

import pytest

from tandem import SamplingParams, native
from tandem.native import suffix_index
from tandem.spec_decode.suffix import SuffixIndex, SuffixProposer
from tandem.worker.request_state import RequestState

ISAS = native.runnable_isas()


def _lib(isa: str):
    lib = suffix_index.load(isa)
    if lib is None:
        pytest.skip("native kernels off or no C compiler")
    return lib


def _state(rid: str, prompt: list[int]) -> RequestState:
    return RequestState(rid, 0, list(prompt), [], SamplingParams(), 0, [], 0)


@pytest.mark.parametrize("isa", ISAS)
def test_contents_equal_the_reference_after_additions_and_removals(isa):
    rnd = random.Random(1)
    for vocab, depth in ((3, 4), (40, 24), (5000, 8)):
        ref, nat = SuffixIndex(depth), suffix_index.NativeSuffixIndex(_lib(isa), depth)
        seqs = [[rnd.randrange(vocab) for _ in range(rnd.randrange(1, 300))] for _ in range(6)]
        for seq in seqs:
            done = 0
            while done < len(seq):  # added in pieces, as a request's index follows its steps
                end = min(len(seq), done + rnd.randrange(1, 40))
                ref.add(seq[:end], done)
                nat.add(seq[:end], done)
                done = end
        for seq in seqs[:3]:
            ref.add(seq, 5, sign=-1)
            nat.add(seq, 5, sign=-1)
        assert len(nat) == len(ref) > 0
        for key in ref.table:
            assert nat.counts(key) == ref.counts(key)
        for seq in seqs[:3]:
            ref.add(seq[:5], 0, sign=-1)
            nat.add(seq[:5], 0, sign=-1)
        for seq in seqs[3:]:
            ref.add(seq, 0, sign=-1)
            nat.add(seq, 0, sign=-1)
        assert len(ref) == len(nat) == 0


@pytest.mark.parametrize("isa", ISAS)
def test_drafts_equal_the_reference_at_every_step(isa):
    """Requests one after another, each drafting at every step of its output with a random limit, each then
    lending its output to a global index of a few cached requests (evicting the oldest); several vocabularies,
    depths, spec factors and probability floors."""
    rnd = random.Random(0)
    lib = _lib(isa)
    for trial in range(24):
        vocab = rnd.choice([3, 6, 50, 1000])
        args = (8, rnd.choice([1, 3, 8, 24]), rnd.choice([0, 1, 3]), rnd.choice([0.5, 1.0, 4.0]),
                rnd.choice([0.0, 0.1, 0.3]))
        ref, nat = SuffixProposer(*args), SuffixProposer(*args, lib=lib)
        drafted = 0
        for r in range(6):
            prompt = [rnd.randrange(vocab) for _ in range(rnd.randrange(1, 60))]
            a, b = _state(f"r{r}", prompt), _state(f"r{r}", prompt)
            for _ in range(rnd.randrange(0, 40)):
                limit = rnd.randrange(0, 9)
                got = nat.propose_one(b, limit)
                assert got == ref.propose_one(a, limit), (trial, r)
                drafted += len(got)
                token = rnd.randrange(vocab)
                a.output_token_ids.append(token)
                b.output_token_ids.append(token)
            ref.remove_requests({f"r{r}"})
            nat.remove_requests({f"r{r}"})
            assert len(nat.global_index) == len(ref.global_index)
        assert drafted > 0 or vocab == 1000


@pytest.mark.parametrize("isa", ISAS)
def test_a_global_index_that_keeps_evicting_stays_bounded(isa):
    lib = _lib(isa)
    p = SuffixProposer(4, 24, 2, 1.0, 0.1, lib=lib)
    rnd = random.Random(2)
    for r in range(200):
        st = _state(f"r{r}", [rnd.randrange(30000) for _ in range(20)])
        st.output_token_ids.extend(rnd.randrange(30000) for _ in range(100))
        p.propose_one(st, 0)
        p.remove_requests({f"r{r}"})
        if r == 10:
            slots = p.global_index.slots()
    assert len(p.global_index) > 0
    assert p.global_index.slots() == slots  # rebuilt in place: the evicted keys' slots were reused
