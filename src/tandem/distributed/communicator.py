"""The collectives tensor parallelism needs: a sum all-reduce and an all-gather, behind one interface.

``SingleRank`` is the trivial communicator of an unsharded model: both collectives return their input,
so a model built for one rank runs exactly the code it would run sharded, minus the communication.
``TorchCommunicator`` wraps a ``torch.distributed`` process group (gloo on CPU, NCCL on CUDA).

Every rank must call the same collectives in the same order with the same shapes: tandem guarantees
it by running the same batch on every rank (see ``docs/ARCHITECTURE.md``, tensor parallelism).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class CommStats:
    """Calls and wall time per collective (benchmarks read these; two clock reads per call)."""

    all_reduce_calls: int = 0
    all_reduce_s: float = 0.0
    all_gather_calls: int = 0
    all_gather_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class Communicator:
    """The interface; the base class is the single-rank case."""

    rank: int = 0
    world_size: int = 1

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place on a contiguous ``t``; returns ``t``."""
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``t`` (equal shapes on all ranks), in rank order."""
        return [t]

    @property
    def stats(self) -> CommStats | None:
        return None

    def close(self) -> None:
        """Leave the group (no-op for one rank)."""


class SingleRank(Communicator):
    """One rank, no communication."""


SINGLE_RANK = SingleRank()


class TorchCommunicator(Communicator):
    """Collectives over a ``torch.distributed`` process group (``group=None``: the default one)."""

    def __init__(self, rank: int, world_size: int, group: Any = None, timed: bool = True) -> None:
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self._stats = CommStats() if timed else None

    @property
    def stats(self) -> CommStats | None:
        return self._stats

    def close(self) -> None:
        """Leave the default group in step with the other ranks: a barrier, then its teardown. A rank
        that exits with the group still up can abort in gloo's background threads at interpreter
        shutdown ("terminate called without an active exception") while a peer is still talking."""
        import torch.distributed as dist

        if self.group is None and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        t0 = time.perf_counter()
        dist.all_reduce(t, group=self.group)
        if self._stats is not None:
            self._stats.all_reduce_calls += 1
            self._stats.all_reduce_s += time.perf_counter() - t0
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        import torch.distributed as dist

        t0 = time.perf_counter()
        t = t.contiguous()
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self.group)
        if self._stats is not None:
            self._stats.all_gather_calls += 1
            self._stats.all_gather_s += time.perf_counter() - t0
        return out
