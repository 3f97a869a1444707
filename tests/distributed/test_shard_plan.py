"""Which slices each tensor-parallel rank holds: every head, KV head, FFN column and vocab row exactly
once (KV heads: once per rank sharing them), query heads always with their own KV head."""

from __future__ import annotations

import pytest

from tandem.model.parallel import ShardPlan, split_range
from tests.distributed.tiny import tiny_args

SMOLLM2 = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, head_dim=64,
)


def test_split_range_covers_evenly() -> None:
    for n in range(1, 20):
        for parts in range(1, n + 1):
            ranges = [split_range(n, parts, i) for i in range(parts)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            sizes = [hi - lo for lo, hi in ranges]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_default_model_on_two_ranks() -> None:
    r0, r1 = ShardPlan.all_ranks(tiny_args(**SMOLLM2), 2)
    assert (r0.heads, r0.kv_heads, r1.heads, r1.kv_heads) == ((0, 6), (0, 2), (6, 9), (2, 3))
    assert (r0.ffn, r1.ffn) == ((0, 768), (768, 1536))
    assert (r0.vocab, r1.vocab, r0.vocab_stride) == ((0, 24576), (24576, 49152), 24576)
    assert r0.q_rows(64) == slice(0, 384) and r1.kv_rows(64) == slice(128, 192)


def test_single_rank_is_everything() -> None:
    args = tiny_args(**SMOLLM2)
    s = ShardPlan.single(args)
    assert (s.num_heads, s.num_kv_heads, s.ffn_size, s.vocab_size) == (9, 3, 1536, 49152)


@pytest.mark.parametrize(
    "heads,kv,world",
    [(9, 3, 2), (9, 3, 3), (6, 3, 2), (8, 2, 4), (8, 2, 2), (4, 1, 2), (4, 1, 3), (12, 4, 3), (16, 2, 8)],
)
def test_heads_follow_their_kv_group(heads: int, kv: int, world: int) -> None:
    args = tiny_args(num_attention_heads=heads, num_key_value_heads=kv, head_dim=8, hidden_size=32)
    plans = ShardPlan.all_ranks(args, world)
    group = heads // kv
    seen = [p.heads for p in plans]
    assert seen[0][0] == 0 and seen[-1][1] == heads
    assert all(a[1] == b[0] for a, b in zip(seen, seen[1:]))  # each query head exactly once
    for p in plans:
        assert p.num_heads >= 1 and p.num_kv_heads >= 1
        for h in range(*p.heads):
            assert p.kv_heads[0] <= h // group < p.kv_heads[1]
        # the attention kernel folds equal-sized groups: local heads / local KV heads is whole
        assert p.num_heads % p.num_kv_heads == 0
    kv_seen = sorted({k for p in plans for k in range(*p.kv_heads)})
    assert kv_seen == list(range(kv))


@pytest.mark.parametrize(
    "heads,kv,world,match",
    [(9, 3, 4, "multiple of num_key_value_heads"), (4, 1, 5, "exceeds the query heads"),
     (2, 1, 4, "exceeds the query heads")],
)
def test_unsupported_splits_say_why(heads: int, kv: int, world: int, match: str) -> None:
    args = tiny_args(num_attention_heads=heads, num_key_value_heads=kv, head_dim=8, hidden_size=32)
    with pytest.raises(ValueError, match=match):
        ShardPlan.build(args, world, 0)
