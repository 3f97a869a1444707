"""Python side of ``core_latency.c``: a cache line's round trip between two of the CPUs this process may run
on, in nanoseconds — what a hypervisor's placement of the vCPUs costs every hand-over between the decode
threads (~65 ns on one core complex, ~340 ns across two on the 2-vCPU AMD EPYC VMs of BENCHMARKS.md §13).
Benchmarks record it beside their timings, so results can be compared within one placement."""

from __future__ import annotations

import ctypes
import os

from tandem import native

# Cut between the two placements seen (~65 ns within a core complex, ~340 across two): BENCHMARKS.md §13.
ACROSS_NS = 200.0


def core_round_trip_ns(rounds: int = 40000) -> float | None:
    """Mean round trip between the first two CPUs of this process's affinity (~5-20 ms at the default rounds);
    ``None`` with fewer than two CPUs or without the native library."""
    cpus = sorted(os.sched_getaffinity(0))
    lib = native.load("core_latency") if len(cpus) >= 2 else None
    if lib is None:
        return None
    fn = lib.tandem_core_round_trip_ns
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_int64], ctypes.c_double
    ns = fn(cpus[0], cpus[1], rounds)
    return ns if ns >= 0.0 else None


def placement(ns: float | None) -> str:
    """``"near"`` (one core complex), ``"far"`` (across two) or ``"unknown"`` for a measured round trip."""
    return "unknown" if ns is None else ("far" if ns >= ACROSS_NS else "near")
