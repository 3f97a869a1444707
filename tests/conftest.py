"""Suite-wide fixtures.

Engines, models and their KV caches are large (hundreds of MB each for the real model); anything a test
leaves in a reference cycle would otherwise wait for the cycle collector's rare full passes, and the
suite's memory would grow module by module on a 24 GB machine. A full collection after each module keeps
the peak at what one module needs, and the allocator's free memory is handed back after every test
(``_trim``). (Cycles in tandem's own objects are bugs of their own: see
tests/model/test_native_decode.py::test_a_dropped_model_is_freed_without_the_cycle_collector.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Iterator

import pytest

_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _trim() -> None:
    """Give the C allocator's free memory back to the system (glibc ``malloc_trim``).

    Freed engines leave hundreds of MB free inside glibc's heaps and per-thread arenas: every engine has its
    own worker thread (an arena of its own), and glibc raises its mmap threshold after each large free, so
    later large tensors come from the heaps and stay resident after they are freed. Measured: after
    tests/spec_decode/test_spec_greedy.py alone, with no model, engine or large tensor alive, the process held
    5.3-8.6 GB; ``malloc_trim(0)`` brought it to 0.56 GB. The whole suite peaked at 11.6-15.4 GB without it."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


@pytest.fixture(autouse=True)
def _trim_after_test() -> Iterator[None]:
    yield
    _trim()


@pytest.fixture(autouse=True, scope="module")
def _collect_after_module() -> Iterator[None]:
    yield
    gc.collect()
    _trim()
