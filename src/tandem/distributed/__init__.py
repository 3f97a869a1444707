"""Tensor-parallel plumbing: communicators (``communicator``), joining a process group
(``process_group``), and the executor-side step fan-out to ranks (``fanout``, imported on its own:
it belongs to the executor layer)."""

from __future__ import annotations

from tandem.distributed.communicator import SINGLE_RANK, CommStats, Communicator, SingleRank
from tandem.distributed.process_group import DistInit, connect

__all__ = ["SINGLE_RANK", "CommStats", "Communicator", "DistInit", "SingleRank", "connect"]
