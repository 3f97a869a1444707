"""Ranks as threads of the test process: a communicator that sums and gathers through shared slots.

Every rank adds the slots in rank order, so all ranks get bitwise-identical results (like a real
all-reduce of two ranks). A rank that raises breaks the barrier, so the others fail instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from tandem.distributed.communicator import Communicator

T = TypeVar("T")


class ThreadGroup:
    def __init__(self, world_size: int, timeout: float = 60.0) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.slots: list[torch.Tensor | None] = [None] * world_size
        self.calls = 0  # all-reduces and all-gathers seen by rank 0


class ThreadCommunicator(Communicator):
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world_size

    def _exchange(self, t: torch.Tensor) -> list[torch.Tensor]:
        g = self.group
        g.slots[self.rank] = t.clone()
        g.barrier.wait()
        got = [s.clone() for s in g.slots if s is not None]
        g.barrier.wait()  # every rank has read before the slots are reused
        if self.rank == 0:
            g.calls += 1
        return got

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        parts = self._exchange(t)
        total = parts[0]
        for p in parts[1:]:
            total += p
        return t.copy_(total)

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        return self._exchange(t)


def run_ranks(world_size: int, fn: Callable[[int, Communicator], T]) -> list[T]:
    """``fn(rank, comm)`` on ``world_size`` threads; results in rank order."""
    group = ThreadGroup(world_size)
    with ThreadPoolExecutor(world_size) as pool:
        futs = [pool.submit(fn, r, ThreadCommunicator(group, r)) for r in range(world_size)]
        return [f.result() for f in futs]
