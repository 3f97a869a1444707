"""Suite-wide fixtures.

Engines, models and their KV caches are large (hundreds of MB each for the real model); anything a test
leaves in a reference cycle would otherwise wait for the cycle collector's rare full passes, and the
suite's memory would grow module by module on a 24 GB machine. A full collection after each module keeps
the peak at what one module needs. (Cycles in tandem's own objects are bugs of their own: see
tests/model/test_native_decode.py::test_a_dropped_model_is_freed_without_the_cycle_collector.)
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _collect_after_module() -> Iterator[None]:
    yield
    gc.collect()
