"""The proposer interface: every drafting method sits behind it; verification is separate.

A proposer runs on the worker right after the target step has sampled. A *device-native* proposer reads
everything from the device (the runner's ``DeviceState`` already holds the tokens just accepted; the
target's hidden states are on the device) and returns drafts as a device tensor, so nothing waits for
the host. A host-side proposer (``device_native = False``) runs behind the ``OnHost`` adapter, which first waits for
this step's tokens and applies them to the host records (traced as ``wait_accepted_counts``) and turns the
lists it returns into the device tensor every proposer returns; the runner knows one kind of proposer.

With async scheduling the drafts stay on the worker (``DeviceState.drafts``) and the host scheduler only
sees ``-1`` slots; with sync scheduling they also travel to the host in ``ModelRunnerOutput``.
Each proposer class declares whether it supports async scheduling; the async decision reads that.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from tandem.async_decision import AsyncCapability, AsyncReason
from tandem.model.forward_batch import ForwardBatch
from tandem.worker.request_state import RequestState

if TYPE_CHECKING:
    from pathlib import Path

    from tandem.config import SpeculativeConfig
    from tandem.model.model_args import ModelArgs
    from tandem.trace.tracer import Tracer
    from tandem.worker.input_batch import InputBatch


@dataclass
class ProposeInput:
    """What the target step leaves for the proposer, for the requests that sampled this step."""

    states: list[RequestState]  # host mirrors (this step's tokens applied only for host proposers)
    slots: torch.Tensor  # [B] slots of the input batch
    input_batch: InputBatch  # tokens / num_tokens already include this step's accepted + bonus tokens
    sampled: torch.Tensor  # [B, K+1] this step's tokens, -1 padded
    max_drafts: torch.Tensor  # [B] exact cap per request (max_tokens / max_model_len / num_drafts), device
    batch: ForwardBatch  # the target step's batch
    # Target hidden states (EAGLE / MTP read them), keyed by layer id (-1 = final normed output); rows of
    # the flat batch, see ``sample_rows``.
    hidden_states: dict[int, torch.Tensor]
    sample_rows: list[list[int]]
    # Drafts asked for this time (the speculation policy's choice, <= k); 0: only keep a drafter's KV current.
    num_drafts: int
    # Requests that advanced this step without sampling (prefill chunks): drafters with their own KV
    # catch up on them so a prefix cached later is valid for the draft too.
    prefill_states: list[RequestState] = field(default_factory=list)
    step_id: int = 0
    # The runner's hook that appends this step's tokens to the host records (``OnHost`` calls it).
    apply_tokens: Callable[[list[list[int]]], None] | None = None
    tokens_applied: bool = False
    # Host copies, filled for host-side proposers only.
    num_accepted: list[int] | None = None
    max_drafts_host: list[int] | None = None


def committed_tokens(sampled: torch.Tensor) -> list[list[int]]:
    """Each row of a step's sampled ids ``[B, K + 1]`` (-1 padded) as the list of tokens it committed."""
    return [[t for t in row if t >= 0] for row in sampled.tolist()]


class Proposer(ABC):
    method: ClassVar[str]
    SUPPORTS_ASYNC_SCHEDULING: ClassVar[bool] = True
    # Drafts computed from device state alone (no host copy of the step's tokens needed).
    device_native: ClassVar[bool] = True
    # Target layers whose residual stream the proposer needs (EAGLE-3); empty for most.
    aux_hidden_layers: tuple[int, ...] = ()
    # Whether the proposer writes its own KV at positions beyond the target's (draft models): the
    # scheduler then reserves k lookahead slots.
    needs_lookahead_slots: ClassVar[bool] = False
    # Whether ``propose`` must also run on steps where no request samples (prefill chunks only), with
    # no sampling requests in its input: drafters that keep their own KV from the target's features.
    needs_prefill_steps: ClassVar[bool] = False
    # Whether ``follow`` runs on steps that draft nothing: a host-side proposer whose per-request state
    # (suffix decoding's index) catches up with every committed token. Left behind, that catch-up (a whole
    # prompt's, ~1.5 ms for 200 tokens) would land on the next step that drafts — an exploration of the
    # speculation policy's, which then prices drafting at it and may stop.
    follows_every_step: ClassVar[bool] = False
    # Under tensor parallelism every rank runs the proposer on its own (drafts are replicated, equal
    # on every rank because its inputs are); a proposer that reads sharded target weights cannot.
    SUPPORTS_TENSOR_PARALLEL: ClassVar[bool] = True

    def __init__(self, num_speculative_tokens: int) -> None:
        self.k = num_speculative_tokens

    @classmethod
    def async_capability(cls) -> AsyncCapability:
        return AsyncCapability(
            kind="speculative",
            name=f"speculative method {cls.method!r}",
            supported=cls.SUPPORTS_ASYNC_SCHEDULING,
            reason=AsyncReason.UNSUPPORTED_SPEC_METHOD,
            fix="set async_scheduling to None (auto) or False, or choose another method",
        )

    @classmethod
    def kv_bytes_per_block(  # noqa: B027 - optional hook
        cls, config: SpeculativeConfig, target: Path, args: ModelArgs, block_size: int, dtype: torch.dtype
    ) -> int:
        """What one block of the target's KV pool costs the proposer's own cache, in bytes: a drafter's
        layers page by the target's block ids, so the engine's KV budget pays for both (builder.py). Read
        from configs alone (``target``: the model file or directory), before any weights load."""
        return 0

    @abstractmethod
    def propose(self, inp: ProposeInput) -> torch.Tensor | list[list[int]]:
        """Drafts per request: a [B, k] device tensor padded with -1 (device-native proposers), or
        lists of at most ``inp.max_drafts_host[i]`` ids (host-side proposers)."""

    def remove_requests(self, req_ids: set[str]) -> None:  # noqa: B027 - optional hook
        """Forget per-request state (finished / preempted)."""

    def follow(self, states: list[RequestState]) -> None:  # noqa: B027 - optional hook
        """A step that drafts nothing committed tokens of ``states``, already applied to them
        (``follows_every_step``)."""


class OnHost(Proposer):
    """A host-side proposer behind the device interface: the runner calls every proposer the same way."""

    def __init__(self, inner: Proposer, max_model_len: int, tracer: Tracer) -> None:
        super().__init__(inner.k)
        self.inner, self.max_model_len, self.tracer = inner, max_model_len, tracer
        self.method = inner.method
        self.aux_hidden_layers = inner.aux_hidden_layers
        self.needs_lookahead_slots = inner.needs_lookahead_slots
        self.needs_prefill_steps = inner.needs_prefill_steps
        self.follows_every_step = inner.follows_every_step

    def propose(self, inp: ProposeInput) -> torch.Tensor:
        assert inp.apply_tokens is not None
        with self.tracer.span("wait_accepted_counts", track="wait", step=inp.step_id):
            lists = committed_tokens(inp.sampled)
        inp.apply_tokens(lists)
        inp.tokens_applied = True
        inp.num_accepted = [len(t) - 1 for t in lists]
        inp.max_drafts_host = [min(st.max_drafts(self.k, self.max_model_len), inp.num_drafts) for st in inp.states]
        drafts = self.inner.propose(inp)
        assert isinstance(drafts, list)
        k = self.k
        return torch.tensor([(d + [-1] * k)[:k] for d in drafts], dtype=torch.int64).view(len(drafts), k).to(
            inp.slots.device)

    def remove_requests(self, req_ids: set[str]) -> None:
        self.inner.remove_requests(req_ids)

    def follow(self, states: list[RequestState]) -> None:
        self.inner.follow(states)
