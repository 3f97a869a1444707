"""The KV budget of ``gpu_memory_utilization``, vLLM's meaning on each device.

CPU (vLLM's CPU backend): the engine may hold that fraction of the machine's memory; the KV cache gets what is
left after what the process already holds and the weights it is about to load. A fraction larger than the
memory available now is refused (too high for what other processes use), as vLLM's CPU worker does.
CUDA: that fraction of the device's memory, less what is already in use on it and the weights to load.
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


def _cuda_kv_budget(fraction: float, weight_bytes: int, device: str) -> int:
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    budget = int(total * fraction) - (total - free) - weight_bytes
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization={fraction} ({total * fraction / 2**30:.2f} GiB of {device}) leaves nothing "
            f"for the KV cache after what is in use ({(total - free) / 2**30:.2f} GiB) and the weights; raise it"
        )
    return budget


def utilization_kv_budget(fraction: float, weight_bytes: int, device: str = "cpu") -> int:
    """Bytes for the KV cache: ``fraction`` of the machine's memory less this process's resident bytes and
    the weights still to load (``weight_bytes``). ``ValueError`` naming ``gpu_memory_utilization`` when
    nothing is left or the whole does not fit in the memory available now."""
    if device.startswith("cuda"):
        return _cuda_kv_budget(fraction, weight_bytes, device)
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
