"""The ``quantization`` setting: keep the request, resolve it, say why (like ``async_scheduling``).

| requested        | a quantized GGUF file, float32 on one CPU rank | otherwise (HF directory, float GGUF, bf16, CUDA, TP > 1) |
|------------------|------------------------------------------------|-----------------------------------------------------------|
| None / "auto"    | "gguf" (``quantized_gguf``)                    | "none" (the first reason that applies)                    |
| "gguf"           | "gguf" (``explicit``)                          | ``ValueError`` naming ``quantization`` and the reason     |
| "none"           | "none" (``explicit``)                          | "none" (``explicit``)                                     |

``"gguf"`` keeps every matrix stored in a block type with a native kernel in its blocks
(model/block_quant.py); activations stay float32. ``"none"`` dequantizes every weight at load and casts
it to ``dtype``. Imports nothing heavy, so ``tandem config`` can print the decision without weights.
"""

from __future__ import annotations

from dataclasses import dataclass

QUANTIZATION_CHOICES = (None, "auto", "gguf", "none")


@dataclass(frozen=True)
class QuantizationDecision:
    requested: str | None
    resolved: str  # "gguf" | "none"
    reason: str

    @property
    def keep_quantized(self) -> bool:
        return self.resolved == "gguf"

    def as_dict(self) -> dict[str, object]:
        return {"requested": self.requested, "resolved": self.resolved, "reason": self.reason}


def resolve_quantization(
    requested: str | None, *, quantized_gguf: bool, dtype: str, device: str, tensor_parallel_size: int
) -> QuantizationDecision:
    """``quantized_gguf``: the model is a GGUF file with block-quantized matrices; ``dtype``: the resolved
    compute dtype name."""
    if requested not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization must be one of {QUANTIZATION_CHOICES[1:]} or None, got {requested!r}")
    if requested == "none":
        return QuantizationDecision(requested, "none", "explicit")
    blockers = [
        (not quantized_gguf, "not_quantized_gguf", "the model is not a GGUF file with quantized matrices"),
        (not device.startswith("cpu"), "device", f"block-quantized kernels run on the CPU, not {device!r}"),
        (dtype != "float32", "dtype", f"block-quantized kernels take float32 activations, not dtype {dtype!r}"),
        (tensor_parallel_size > 1, "tensor_parallel", "block-quantized weights run on one rank"),
    ]
    for blocked, reason, why in blockers:
        if blocked:
            if requested == "gguf":
                raise ValueError(f"quantization 'gguf' cannot be honoured: {why} ({reason}); use 'none' or auto")
            return QuantizationDecision(requested, "none", reason)
    return QuantizationDecision(requested, "gguf", "explicit" if requested == "gguf" else "quantized_gguf")
