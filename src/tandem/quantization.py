"""The ``quantization`` setting: keep the request, resolve it, say why (like ``async_scheduling``).

| requested        | a quantized GGUF file, float32 on one CPU rank | otherwise (HF directory, float GGUF, bf16, CUDA, TP > 1) |
|------------------|------------------------------------------------|-----------------------------------------------------------|
| None / "auto"    | "gguf" (``quantized_gguf``)                    | "none" (the first reason that applies)                    |
| "gguf"           | "gguf" (``explicit``)                          | ``ValueError`` naming ``quantization`` and the reason     |
| "int8"           | "int8" (``explicit``) on one CPU rank in float32, any checkpoint | ``ValueError`` (device, dtype, TP)      |
| "none"           | "none" (``explicit``)                          | "none" (``explicit``)                                     |

A GGUF file whose layer matrices include a block type without a native kernel (kernels: Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K, Q5_K, Q6_K; without: e.g. Q2_K, Q3_K, the IQ types) is one of the "otherwise" cases, with the reason
``block_types``.

``"gguf"`` keeps every matrix stored in a block type with a native kernel in its blocks
(model/block_quant.py). ``"int8"`` is weight-only int8 for any checkpoint (safetensors or GGUF): each layer
matrix rounded at load to int8 with one float32 scale per output feature (model/quant.py, the draft heads'
format), the embedding and LM head kept float32. ``"none"`` dequantizes every weight at load and casts it to
``dtype``. Imports nothing heavy, so ``tandem config`` can print the decision without weights.

``quant_activations``: what the products on the interleaved Q4_0 / Q4_1 / Q8_0 matrices of a ``"gguf"`` model
quantize their float32 inputs to (native/quant_r16_i8.h); the model's activations are float32 throughout.

| requested       | "gguf", int8 dot products on SIMD: AVX-512 VNNI / AVX2 | "gguf", neither (portable C) | "none"          |
|-----------------|--------------------------------------------------------|------------------------------|-----------------|
| None / "auto"   | "int8x2" (``vnni`` / ``avx2``)                         | "float32" (``no_simd_int8``) | "float32" (``not_gguf``) |
| "float32" / "int8" / "int8x2" | as requested (``explicit``; without SIMD int8 runs the portable C path) | | ``ValueError`` unless "float32" |

``"int8x2"`` (two int8 levels per 32-input block: the block quantized, then its residual) keeps the outputs
at the float32 product's up to ~5e-6 relative and is the fastest exact-enough choice measured here
(BENCHMARKS.md §13 with VNNI, §24 on AVX2); ``"int8"`` is llama.cpp's one level (lossy: ~1.5e-3 relative), an option.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

QUANTIZATION_CHOICES = (None, "auto", "gguf", "int8", "none")
ACTIVATION_CHOICES = (None, "auto", "float32", "int8", "int8x2")


@dataclass(frozen=True)
class QuantizationDecision:
    requested: str | None
    resolved: str  # "gguf" | "int8" | "none"
    reason: str
    # the block-quantized products' inputs (only "gguf" has any): requested, resolved, why
    activations_requested: str | None = None
    activations: str = "float32"
    activations_reason: str = "not_gguf"

    @property
    def keep_quantized(self) -> bool:
        return self.resolved == "gguf"

    @property
    def int8_weights(self) -> bool:
        return self.resolved == "int8"

    def as_dict(self) -> dict[str, object]:
        return {
            "requested": self.requested, "resolved": self.resolved, "reason": self.reason,
            "activations": {"requested": self.activations_requested, "resolved": self.activations,
                            "reason": self.activations_reason},
        }  # fmt: skip


def resolve_activations(decision: QuantizationDecision, requested: str | None,
                        int8_path: str | None) -> QuantizationDecision:
    """``decision`` with its activations resolved (the table above); ``int8_path``: where the compiled kernels
    run int8 activations (``QuantLinearKernel.int8_path``: "vnni", "avx2" or "portable"; None without kernels)."""
    if requested not in ACTIVATION_CHOICES:
        raise ValueError(f"quant_activations must be one of {ACTIVATION_CHOICES[1:]} or None, got {requested!r}")
    explicit = requested not in (None, "auto")
    if not decision.keep_quantized:
        if explicit and requested != "float32":
            raise ValueError(
                f"quant_activations {requested!r} needs quantization 'gguf' (resolved {decision.resolved!r}: "
                f"{decision.reason})"
            )
        act, why = "float32", "explicit" if explicit else "not_gguf"
    elif explicit:
        act, why = str(requested), "explicit"
    else:
        act, why = ("int8x2", str(int8_path)) if int8_path in ("vnni", "avx2") else ("float32", "no_simd_int8")
    return replace(decision, activations_requested=requested, activations=act, activations_reason=why)


def resolve_quantization(
    requested: str | None, *, quantized_gguf: bool, dtype: str, device: str, tensor_parallel_size: int,
    unkernelled: tuple[str, ...] | list[str] = (),
) -> QuantizationDecision:
    """``quantized_gguf``: the model is a GGUF file with block-quantized matrices; ``dtype``: the resolved
    compute dtype name; ``unkernelled``: block types of its layer matrices without a native kernel."""
    if requested not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization must be one of {QUANTIZATION_CHOICES[1:]} or None, got {requested!r}")
    if requested == "none":
        return QuantizationDecision(requested, "none", "explicit")
    if requested == "int8":
        for blocked, why in (
            (not device.startswith("cpu"), f"weight-only int8 runs on the CPU, not {device!r} (device)"),
            (dtype != "float32", f"weight-only int8 takes float32 activations, not dtype {dtype!r} (dtype)"),
            (tensor_parallel_size > 1, "weight-only int8 runs on one rank (tensor_parallel)"),
        ):
            if blocked:
                raise ValueError(f"quantization 'int8' cannot be honoured: {why}; use 'none' or auto")
        return QuantizationDecision(requested, "int8", "explicit")
    blockers = [
        (not quantized_gguf, "not_quantized_gguf", "the model is not a GGUF file with quantized matrices"),
        (bool(unkernelled), "block_types",
         f"no native kernel computes on its {', '.join(unkernelled)} layer matrices"),
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
