"""The cache line's round trip between two CPUs (native/core_latency.c) that benchmarks record beside their
timings, and its reading as the vCPUs' placement."""

from __future__ import annotations

import ctypes
import os

import pytest

from tandem import native
from tandem.native.core_latency import ACROSS_NS, core_round_trip_ns, placement

TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


@pytest.mark.skipif(not TWO_CPUS or native.load("core_latency") is None, reason="needs two CPUs and native kernels")
def test_round_trip_is_measured_and_the_affinity_put_back() -> None:
    before = os.sched_getaffinity(0)
    ns = core_round_trip_ns(2000)
    assert ns is not None and 1.0 < ns < 1e6
    assert os.sched_getaffinity(0) == before  # the calling thread was pinned for the call only
    fn = native.load("core_latency").tandem_core_round_trip_ns
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_int64], ctypes.c_double
    cpus = sorted(before)
    assert fn(cpus[0], cpus[1], 0) == -2.0  # no rounds asked for
    assert fn(cpus[0], 1 << 20, 10) == -1.0  # a CPU that does not exist cannot be pinned to
    assert os.sched_getaffinity(0) == before


def test_placement_reads_the_round_trip() -> None:
    assert placement(None) == "unknown"
    assert placement(65.0) == "near"
    assert placement(ACROSS_NS) == "far"
    assert placement(340.0) == "far"
