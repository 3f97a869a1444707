"""Random GGUF blocks for the block-quantization tests: every bit pattern of the quantized fields, with the
float16 scale fields set to small finite values (arbitrary bytes would make some scales inf / NaN)."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
KERNEL_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# byte offsets of each type's float16 fields within a block
F16_FIELDS = {
    Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2),
    Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82),
}  # fmt: skip


def random_blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """``[rows, row bytes]`` uint8: random quantized fields, scales ~ N(0, scale) as float16."""
    block, nbytes = GGML_QUANT_SIZES[qtype]
    if block == 256:  # K-quants: d times a 6-bit (or 8-bit) sub-block scale
        scale /= 32
    raw = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        d = (rng.standard_normal(raw.shape[0]) * scale).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, cols // block * nbytes)


def block_weight(qtype: Q, out: int, inp: int, seed: int):
    """A ``[out, inp]`` BlockQuantWeight of random blocks (GGML rows)."""
    from tandem.model.block_quant import BlockQuantWeight

    raw = random_blocks(qtype, out, inp, np.random.default_rng(seed))
    return BlockQuantWeight.from_raw(raw, qtype, (out, inp), f"w.{qtype.name}")


def check_product(y, x, w) -> None:
    """``y`` within ``1.5e-5 * sum_i |x_i w_i|`` of the float64 product ``x @ w^T`` (the tests' tolerance)."""
    ref = x.double() @ w.double().T
    bound = 1.5e-5 * (x.double().abs() @ w.double().abs().T)
    err = (y.double() - ref).abs()
    assert bool((err <= bound + 1e-30).all()), f"max error {float(err.max()):.3g}, bound {float(bound.min()):.3g}"
