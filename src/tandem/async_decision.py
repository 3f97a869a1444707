"""The async_scheduling contract: keep the user's request, resolve it, say why.

| requested | resolved when every component supports async | when one does not            |
|-----------|----------------------------------------------|------------------------------|
| False     | False (explicit_disabled)                    | False (explicit_disabled)    |
| True      | True  (explicit_enabled)                     | AsyncSchedulingError         |
| None      | True  (compatible_default)                   | False (first failing reason) |

Capabilities are declared by the components themselves (``SUPPORTS_ASYNC_SCHEDULING`` and
``ASYNC_UNSUPPORTED_REASON`` on each executor class, proposer class, ...), collected into
:class:`AsyncCapability` records by the engine, and checked here in one documented order:

1. model runner          (``pooling_model``: a pooling runner computes each prompt once and samples nothing,
                            so there is no next step's input to prepare while one runs)
2. executor backend      (``unsupported_executor``)
3. pipeline parallelism  (``pipeline_parallel``)
4. speculative proposer  (``unsupported_spec_method``, ``padded_drafter_batch_disabled``)
5. any other feature     (its own reason)

This module imports nothing heavy so ``tandem config`` can print a decision without loading weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

logger = logging.getLogger("tandem.async")


class AsyncReason(str, Enum):
    EXPLICIT_DISABLED = "explicit_disabled"
    EXPLICIT_ENABLED = "explicit_enabled"
    COMPATIBLE_DEFAULT = "compatible_default"
    UNSUPPORTED_EXECUTOR = "unsupported_executor"
    PIPELINE_PARALLEL = "pipeline_parallel"
    UNSUPPORTED_SPEC_METHOD = "unsupported_spec_method"
    PADDED_DRAFTER_BATCH_DISABLED = "padded_drafter_batch_disabled"
    UNSUPPORTED_FEATURE = "unsupported_feature"
    POOLING_MODEL = "pooling_model"


# The order in which component kinds are checked; the first unsupported one names the reason.
CHECK_ORDER = ("runner", "executor", "pipeline_parallel", "speculative", "feature")


@dataclass(frozen=True)
class AsyncCapability:
    """What one component says about async scheduling."""

    kind: str  # one of CHECK_ORDER
    name: str  # e.g. "executor 'uni'", "speculative method 'ngram'"
    supported: bool
    reason: AsyncReason = AsyncReason.UNSUPPORTED_FEATURE  # used when not supported
    fix: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CHECK_ORDER:
            raise ValueError(f"capability kind must be one of {CHECK_ORDER}, got {self.kind!r}")


@dataclass(frozen=True)
class AsyncSchedulingDecision:
    requested: bool | None
    resolved: bool
    reason: AsyncReason
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "requested": self.requested,
            "resolved": self.resolved,
            "reason": self.reason.value,
            "detail": self.detail,
        }

    def log_line(self) -> str:
        req = {None: "auto", True: "on", False: "off"}[self.requested]
        res = "on" if self.resolved else "off"
        extra = f" ({self.detail})" if self.detail else ""
        return f"async scheduling: requested={req} resolved={res} reason={self.reason.value}{extra}"


class AsyncSchedulingError(ValueError):
    """async_scheduling=True was requested but a component cannot run with it."""

    def __init__(self, capability: AsyncCapability) -> None:
        self.reason = capability.reason
        self.capability = capability
        fix = capability.fix or "set async_scheduling to None (auto) or False"
        super().__init__(
            f"async_scheduling=True is not supported: {capability.name} "
            f"(reason: {capability.reason.value}). Fix: {fix}"
        )


def first_unsupported(capabilities: list[AsyncCapability]) -> AsyncCapability | None:
    rank = {kind: i for i, kind in enumerate(CHECK_ORDER)}
    for cap in sorted(capabilities, key=lambda c: rank[c.kind]):  # stable within a kind
        if not cap.supported:
            return cap
    return None


def resolve_async_scheduling(
    requested: bool | None, capabilities: list[AsyncCapability], *, log: bool = True
) -> AsyncSchedulingDecision:
    """Resolve the tri-state request against the components' declared capabilities."""
    if requested not in (None, True, False):
        raise ValueError(f"async_scheduling must be True, False or None, got {requested!r}")
    blocker = first_unsupported(capabilities)
    if requested is False:
        decision = AsyncSchedulingDecision(False, False, AsyncReason.EXPLICIT_DISABLED)
    elif requested is True:
        if blocker is not None:
            raise AsyncSchedulingError(blocker)
        decision = AsyncSchedulingDecision(True, True, AsyncReason.EXPLICIT_ENABLED)
    elif blocker is not None:
        decision = AsyncSchedulingDecision(None, False, blocker.reason, blocker.name)
        if log:
            logger.warning("%s; %s", decision.log_line(), blocker.fix or "")
        return decision
    else:
        decision = AsyncSchedulingDecision(None, True, AsyncReason.COMPATIBLE_DEFAULT)
    if log:
        logger.info(decision.log_line())
    return decision
