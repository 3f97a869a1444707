"""What computes a step, resolved once at start-up: the attention backend, the linear kernels, the native
decoder stack, the native libraries (on or off, and their ISA variant) and where sampled rows' random numbers
come from.

:func:`resolve_execution` makes every choice from the device and the ``TANDEM_*`` overrides (overrides.py,
the only place they are read); ``tandem config`` shows the result (``execution``), and every worker gets it in
its ``WorkerSpec``. A worker builds with the engine's choice and never consults its own environment, so an
``mp`` or Ray worker runs what the engine process resolved even where it did not inherit the variables (a
Ray cluster started earlier, another machine). Each worker reports what it built
(:func:`built_execution`), which the executors keep per rank (``Executor.worker_execution``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

from tandem import native, overrides
from tandem.sample import rng

if TYPE_CHECKING:
    from tandem.model.transformer import CausalLM


@dataclass(frozen=True)
class ExecutionPlan:
    attention_backend: str  # a key of model.attention.ATTENTION_BACKENDS
    linear_kernels: str  # a key of model.linear.LINEAR_KERNELS
    native_decode: bool  # short CPU steps through the native decoder stack (native/decode_forward.c)
    native: bool  # the native C kernels at all
    native_isa: str  # the variant they are built as: native, avx2 or portable (native.ISA_FLAGS)
    compiled_isa: str | None  # what that variant compiles to on this CPU; None without native kernels
    # Sampled rows' random numbers: "native" (each row the counter-based stream at its position key,
    # native/sample_noise.c; the CPU) or "torch" (a torch.Generator seeded with the key); sample/rng.py.
    sampling_noise: str = "torch"

    def __post_init__(self) -> None:
        from tandem.model.attention import ATTENTION_BACKENDS
        from tandem.model.linear import LINEAR_KERNELS

        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend {self.attention_backend!r}; registered: {sorted(ATTENTION_BACKENDS)}"
            )
        if self.linear_kernels not in LINEAR_KERNELS:
            raise ValueError(f"linear_kernels {self.linear_kernels!r}; registered: {sorted(LINEAR_KERNELS)}")
        if self.native_isa not in native.ISA_FLAGS:
            raise ValueError(f"native_isa {self.native_isa!r}; one of {sorted(native.ISA_FLAGS)}")
        if self.sampling_noise not in rng.NOISE_SOURCES:
            raise ValueError(f"sampling_noise {self.sampling_noise!r}; one of {rng.NOISE_SOURCES}")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def apply_process_wide(self) -> None:
        """Make this process's native libraries the plan's (a worker, before it builds anything)."""
        native.configure(enabled=self.native, isa=self.native_isa)
        rng.configure_noise(self.sampling_noise)


def resolve_execution(device: torch.device | str) -> ExecutionPlan:
    """The choices for a model on ``device``: the defaults, or the overrides where set."""
    from tandem.model.attention import default_attention_backend
    from tandem.model.linear import default_linear_kernels
    from tandem.native.decode_forward import decode_forward_kernel

    cpu = torch.device(device).type == "cpu"
    return ExecutionPlan(
        attention_backend=default_attention_backend(device),
        linear_kernels=default_linear_kernels(device),
        native_decode=cpu and overrides.native_decode_enabled() and decode_forward_kernel() is not None,
        native=native.enabled(),
        native_isa=native.default_isa(),
        compiled_isa=native.compiled_isa(),
        sampling_noise=rng.noise_source(device),
    )


def built_execution(model: CausalLM) -> dict[str, object]:
    """What ``model`` was built with, as a worker reports it: the plan's fields read back from the model and
    from this process's native libraries."""
    return ExecutionPlan(
        attention_backend=model.attn_backend.name,
        linear_kernels=model.linear.name,
        native_decode=model._native_decode() is not None,
        native=native.enabled(),
        native_isa=native.default_isa(),
        compiled_isa=native.compiled_isa(),
        sampling_noise=rng.noise_source(model.norm.device),
    ).as_dict()
