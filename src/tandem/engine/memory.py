"""The KV budget of ``gpu_memory_utilization`` on a machine without a GPU: vLLM's CPU backend's meaning.

The engine may hold ``gpu_memory_utilization`` of the machine's memory; the KV cache gets what is left of it
after what the process already holds and the weights it is about to load. A budget larger than the memory
available now is refused (the fraction is too high for what other processes use), as vLLM's CPU worker does.
"""

from __future__ import annotations

import os


def _meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            out[key] = int(rest.split()[0]) * 1024
    return out


def _resident_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def utilization_kv_budget(fraction: float, weight_bytes: int) -> int:
    """Bytes for the KV cache: ``fraction`` of the machine's memory less this process's resident bytes and
    the weights still to load (``weight_bytes``). ``ValueError`` naming ``gpu_memory_utilization`` when
    nothing is left or the whole does not fit in the memory available now."""
    info = _meminfo()
    total, available = info["MemTotal"], info.get("MemAvailable", info["MemFree"])
    wanted = int(total * fraction)
    if wanted - _resident_bytes() > available:
        raise ValueError(
            f"gpu_memory_utilization={fraction} asks for {wanted / 2**30:.1f} GiB of this machine's "
            f"{total / 2**30:.1f} GiB, more than the {available / 2**30:.1f} GiB available now; lower it, or "
            "give kv_cache_memory (bytes) instead"
        )
    budget = wanted - _resident_bytes() - weight_bytes
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization={fraction} ({wanted / 2**30:.2f} GiB) leaves nothing for the KV cache after "
            f"the process and the weights ({(wanted - budget) / 2**30:.2f} GiB); raise it, or give "
            "kv_cache_memory (bytes)"
        )
    return budget
