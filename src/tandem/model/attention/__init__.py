"""Paged-KV attention backends, chosen by name.

The registry is an immutable mapping from name to factory; a new kernel (a compiled or GPU one) is added
here and must pass ``tests/model/test_attention.py``, which checks every registered backend against the
naive reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch

from tandem import overrides
from tandem.model.attention.base import AttentionBackend, slots_for_positions, write_kv
from tandem.model.attention.naive import NaiveBackend
from tandem.model.attention.paged_cpu import PagedCpuBackend
from tandem.model.attention.sdpa import SdpaBackend

# paged_cpu runs the native kernel for short queries on CPU tensors and is SDPA everywhere else.
DEFAULT_ATTENTION_BACKEND = "paged_cpu"

ATTENTION_BACKENDS: Mapping[str, Callable[[torch.dtype], AttentionBackend]] = MappingProxyType(
    {"paged_cpu": PagedCpuBackend, "sdpa": SdpaBackend, "naive": NaiveBackend}
)


def default_attention_backend(device: torch.device | str = "cpu") -> str:
    """``paged_cpu`` on the CPU, ``sdpa`` on other devices (where ``paged_cpu`` would only fall back to SDPA:
    shown as what runs), or the backend named by ``TANDEM_ATTENTION_BACKEND`` (for A/B measurements)."""
    cpu = torch.device(device).type == "cpu"
    name = overrides.attention_backend() or (DEFAULT_ATTENTION_BACKEND if cpu else "sdpa")
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"TANDEM_ATTENTION_BACKEND={name!r}; registered: {sorted(ATTENTION_BACKENDS)}"
        )
    return name


def create_attention_backend(name: str, dtype: torch.dtype) -> AttentionBackend:
    """Instantiate the backend registered as ``name`` for activations of ``dtype``."""
    try:
        factory = ATTENTION_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; registered: {sorted(ATTENTION_BACKENDS)}"
        ) from None
    return factory(dtype)


__all__ = [
    "ATTENTION_BACKENDS",
    "DEFAULT_ATTENTION_BACKEND",
    "AttentionBackend",
    "NaiveBackend",
    "PagedCpuBackend",
    "SdpaBackend",
    "create_attention_backend",
    "default_attention_backend",
    "slots_for_positions",
    "write_kv",
]
