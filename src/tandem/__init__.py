"""tandem: an LLM inference engine with overlapped (async) scheduling and exact speculative decoding."""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tandem.engine.llm import LLM
    from tandem.outputs import CompletionOutput, RequestOutput
    from tandem.sample.rejection import rejection_sample
    from tandem.sampling_params import SamplingParams

_LAZY = {
    "LLM": "tandem.engine.llm",
    "SamplingParams": "tandem.sampling_params",
    "RequestOutput": "tandem.outputs",
    "CompletionOutput": "tandem.outputs",
    "rejection_sample": "tandem.sample.rejection",
    "AsyncSchedulingDecision": "tandem.async_decision",
    "EngineArgs": "tandem.engine.arg_utils",
    "AsyncEngineArgs": "tandem.engine.arg_utils",
    "AsyncLLM": "tandem.engine.async_llm",
    "RequestOutputKind": "tandem.sampling_params",
    "StructuredOutputsParams": "tandem.sampling_params",
}


def __getattr__(name: str) -> Any:
    # Lazy: ``import tandem`` stays cheap (no torch) for the CLI's config path and the pure core.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tandem' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "rejection_sample", "EngineArgs",
           "AsyncEngineArgs", "AsyncLLM", "RequestOutputKind", "StructuredOutputsParams"]
