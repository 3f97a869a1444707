"""Every ``TANDEM_*`` environment variable tandem reads, in one place.

They are overrides for A/B measurements, tests and deployment, never the way a feature is chosen: what runs is
resolved from the engine config once at start-up (the kernel choices: ``tandem/execution.py``), shown by
``tandem config`` (``EnginePlan.as_dict()["overrides"]`` lists the ones set) and carried to every worker, which
never reads them itself. Each is read when its function is called, so a test can set one for a single case.

| variable | effect |
|---|---|
| ``TANDEM_NATIVE=0`` | no native C kernels: torch ops everywhere |
| ``TANDEM_NATIVE_ISA`` | ``native`` (default), ``avx2`` or ``portable``: the ISA variant of the native libraries |
| ``TANDEM_NATIVE_DECODE=0`` | short CPU steps run the torch layers instead of the native decoder stack |
| ``TANDEM_LINEAR_KERNELS`` | ``torch`` / ``cpu`` / ``onednn`` / ``native``: the linear formulation |
| ``TANDEM_ATTENTION_BACKEND`` | ``paged_cpu`` / ``sdpa`` / ``naive``: the attention backend |
| ``TANDEM_SAMPLING_NOISE`` | ``native`` (default on the CPU) / ``torch``: sampled rows' random numbers' source |
| ``TANDEM_DEBUG_INVARIANTS=1`` | check every ledger and block-pool invariant after every step |
| ``TANDEM_CACHE_DIR`` | where exported drafts and built kernels live (default ``$XDG_CACHE_HOME/tandem``) |
| ``TANDEM_API_KEY`` | the server's (and ``tandem bench serve``'s) API key when ``--api-key`` is not given |

Imports nothing heavy (``tandem config`` and the torch-free core may use it).
"""

from __future__ import annotations

import os

VARIABLES = (
    "TANDEM_NATIVE", "TANDEM_NATIVE_ISA", "TANDEM_NATIVE_DECODE", "TANDEM_LINEAR_KERNELS",
    "TANDEM_ATTENTION_BACKEND", "TANDEM_SAMPLING_NOISE", "TANDEM_DEBUG_INVARIANTS", "TANDEM_CACHE_DIR",
    "TANDEM_API_KEY",
)  # fmt: skip


def _get(name: str) -> str | None:
    return os.environ.get(name) or None


def native_enabled() -> bool:
    return os.environ.get("TANDEM_NATIVE", "1") != "0"


def native_isa() -> str | None:
    return _get("TANDEM_NATIVE_ISA")


def native_decode_enabled() -> bool:
    return os.environ.get("TANDEM_NATIVE_DECODE", "1") != "0"


def linear_kernels() -> str | None:
    return _get("TANDEM_LINEAR_KERNELS")


def attention_backend() -> str | None:
    return _get("TANDEM_ATTENTION_BACKEND")


def sampling_noise() -> str | None:
    return _get("TANDEM_SAMPLING_NOISE")


def debug_invariants() -> bool:
    return os.environ.get("TANDEM_DEBUG_INVARIANTS", "") not in ("", "0", "false")


def cache_dir() -> str | None:
    return _get("TANDEM_CACHE_DIR")


def api_key() -> str | None:
    return _get("TANDEM_API_KEY")


def active() -> dict[str, str]:
    """The ``TANDEM_*`` overrides set in this process (the API key's value hidden)."""
    return {k: ("<set>" if k == "TANDEM_API_KEY" else os.environ[k]) for k in VARIABLES if os.environ.get(k)}
