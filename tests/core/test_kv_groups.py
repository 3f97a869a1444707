"""KV cache groups (core/kv_cache_manager.py), pure Python: the layout from the layers' windows, what one request
can hold, and a window group handing back only what no future query sees, after the step that wrote it came
back, into the prefix cache first."""

from __future__ import annotations

import pytest

from tandem.core.kv_cache_manager import (
    KVCacheManager,
    blocks_for_tokens,
    kv_cache_groups,
    layer_placement,
    request_capacity,
)
from tandem.core.request import Request
from tandem.sampling_params import SamplingParams


def test_layout_global_layers_first_then_window_runs_of_as_many() -> None:
    gemma = tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(18))
    groups = kv_cache_groups(gemma, 18)
    assert groups[0] == (0, (5, 11, 17))
    assert [w for w, _ in groups] == [0] + [512] * 5 and all(len(layers) == 3 for _, layers in groups)
    group_of, tensor_of = layer_placement(groups, 18)
    assert group_of[5] == 0 and tensor_of[11] == 1 and group_of[0] == 1 and tensor_of[2] == 2
    assert kv_cache_groups((), 4) == ((0, (0, 1, 2, 3)),)  # no windows: one group
    assert kv_cache_groups((8, 8), 2) == ((8, (0, 1)),)  # every layer windowed: one window group
    with pytest.raises(ValueError, match="one sliding-window size"):
        kv_cache_groups((0, 8, 16), 3)


def test_what_one_request_can_hold() -> None:
    windows = (0, 8)
    assert blocks_for_tokens(100, 4, windows, 1) == 25 + 4  # window group: ceil(9 / 4) + 1
    assert blocks_for_tokens(6, 4, windows, 1) == 2 + 2
    assert request_capacity(30, 4, windows, 1) == 100  # 29 usable blocks (one is the null block)
    assert request_capacity(30, 4, (0,)) == 120


def test_window_group_releases_what_no_query_sees_and_caches_it_first() -> None:
    """(Holding blocks of a step still in flight is covered through the engine, async scheduling on:
    tests/engine/test_sliding_window_kv.py.)"""
    kv = KVCacheManager(64, 4, True, (0, 8), lookback=1)
    req = Request("r", list(range(40)), SamplingParams(max_tokens=8), seed=0)
    assert kv.allocate_slots(req, 40)
    assert kv.num_blocks_held(req) == 10 + 10  # a prefill chunk needs every block at once
    req.num_computed_tokens = 40
    req.output_token_ids.append(7)
    assert kv.allocate_slots(req, 1)  # the decode at position 40 sees 33..40 (and 32 for the lookback)
    released = [b for b in req.group_block_ids[0] if b == 0]  # the null block
    assert len(released) == (40 - 8 + 1 - 1) // 4 == 8
    assert kv.num_blocks_held(req) == 11 + 3
    kv.check_invariants({"r": req})
    kv.free(req)
    assert kv.all_free()
    again = Request("s", list(range(40)), SamplingParams(max_tokens=8), seed=0)
    hits, n = kv.get_computed_blocks(again)  # the released blocks were cached first: served again
    assert n == 36 and len(hits) == 2 and len(hits[1]) == 9
