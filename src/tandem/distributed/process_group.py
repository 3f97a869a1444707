"""Joining a tensor-parallel process group: gloo on CPU, NCCL on CUDA.

The rendezvous needs no fixed port. On one machine (the ``mp`` executor) ranks meet through a
``FileStore`` in a private temporary directory; across machines (the ``ray`` executor) through a TCP
store on rank 0's node at a port rank 0's host picked free at run time. On one machine gloo's own
sockets are pinned to the loopback interface (``GLOO_SOCKET_IFNAME``, unless the user set it).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch

from tandem.distributed.communicator import SINGLE_RANK, Communicator, TorchCommunicator

_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class DistInit:
    """How every rank of one group joins it; crosses process boundaries by pickle."""

    world_size: int
    init_method: str  # "file:///tmp/tandem-tp-xxx/store" or "tcp://HOST:PORT"
    backend: str = "gloo"
    loopback: bool = True  # all ranks on this machine: keep gloo's sockets on the loopback interface
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be positive, got {self.world_size}")
        if self.backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {self.backend!r}")
        if not self.init_method.startswith(("file://", "tcp://")):
            raise ValueError(f"init_method must be file:// or tcp://, got {self.init_method!r}")

    @staticmethod
    def backend_for(device: str) -> str:
        return "nccl" if device.startswith("cuda") else "gloo"


def file_init_method(directory: str) -> str:
    return f"file://{os.path.join(directory, 'store')}"


def loopback_interface() -> str:
    for _, name in socket.if_nameindex():
        if name.startswith("lo"):
            return name
    return "lo"


def free_tcp_port(host: str) -> int:
    """A port the OS reports free on ``host`` now (the store binds it right after; a tiny race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def connect(init: DistInit | None, rank: int, device: torch.device) -> Communicator:
    """Join the group as ``rank`` (blocks until every rank has joined); ``None``: one rank."""
    if init is None or init.world_size == 1:
        return SINGLE_RANK
    import torch.distributed as dist

    if not 0 <= rank < init.world_size:
        raise ValueError(f"rank {rank} outside [0, {init.world_size})")
    if init.backend == "gloo" and init.loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    device_id = None
    if device.type == "cuda":
        torch.cuda.set_device(device)
        device_id = device  # NCCL binds its communicator to this device eagerly
    dist.init_process_group(
        init.backend,
        init_method=init.init_method,
        rank=rank,
        world_size=init.world_size,
        timeout=timedelta(seconds=init.timeout_s),
        device_id=device_id,
    )
    return TorchCommunicator(rank, init.world_size)


def rank_device(device: str, rank: int, one_device_per_process: bool) -> str:
    """The device of ``rank``: CPU for every rank; on CUDA ``cuda:rank`` when all ranks share one
    machine's devices (``mp``), the one visible device when each process sees only its own (Ray)."""
    if not device.startswith("cuda"):
        return device
    if one_device_per_process:
        return "cuda:0"
    base = int(device.split(":")[1]) if ":" in device else 0
    return f"cuda:{base + rank}"
