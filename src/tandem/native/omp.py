"""The OpenMP runtime that torch and the native kernels share (GNU ``libgomp``): keeping a second thread's idle
team from slowing the engine's.

Every thread that runs an OpenMP parallel region keeps a team of helper threads for its next one. libgomp
counts all of them, and once it manages more threads than the machine has CPUs it stops spinning between
regions (``GOMP_SPINCOUNT``'s throttled count, ~1,000 spins): a helper then sleeps after each region and every
region pays a futex wake-up. The engine runs its forward on its worker thread; if the thread that drives the
engine (the caller of ``LLM.generate``) has also run a parallel torch op — any op on more than ~32k elements,
a test computing a reference, a notebook cell — the two teams together exceed two CPUs and the worker's
regions get 2-4x slower (BENCHMARKS.md §17, "A second OpenMP team"). :func:`release_idle_team` hands the
calling thread's idle helpers back (OpenMP 5's ``omp_pause_resource_all(omp_pause_soft)``, which frees only the
calling thread's pool and refuses inside a parallel region); the thread's next parallel op starts a new team.
``LLM`` calls it from the driving thread before each step. Where the runtime is not libgomp, or is older than
OpenMP 5, this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch  # noqa: F401  (torch loads the runtime this module looks for)

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: omp_pause_soft


def _loaded_gomp() -> str | None:
    """The path of the libgomp this process has loaded (torch's own copy, usually), or ``None``."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(" ", 1)[-1].strip()
                if "/libgomp" in path and ".so" in path:
                    return path
    except OSError:
        pass
    return None


@functools.cache
def _pause() -> Callable[[int], int] | None:
    path = _loaded_gomp()
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def release_idle_team() -> bool:
    """Release the calling thread's idle OpenMP helper threads; whether the runtime took the request (it
    refuses inside a parallel region and where there is nothing it knows how to pause)."""
    fn = _pause()
    return fn is not None and fn(OMP_PAUSE_SOFT) == 0
