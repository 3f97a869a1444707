"""Python side of ``sample_noise.c``: sampled rows' random numbers on the CPU, each row the counter-based stream
at its key (its ``rng.position_key``) from an offset on, as Exp(1) noise or as uniforms. Its reference is
``sample.rng.stream_noise_reference``."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch

from tandem import native

_ABI = 2
EXPONENTIAL, UNIFORM = 0, 1  # sample_noise.c's NOISE_EXPONENTIAL, NOISE_UNIFORM


class SampleNoiseKernel:
    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.tandem_sample_noise_abi.restype = ctypes.c_int
        if lib.tandem_sample_noise_abi() != _ABI:
            raise RuntimeError("sample_noise library ABI mismatch; clear $TANDEM_CACHE_DIR/native")
        self._fn = lib.tandem_stream_noise
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_int, ctypes.c_int]
        self._fn.restype = None

    @staticmethod
    def takes(t: torch.Tensor) -> bool:
        """Whether the kernel can fill ``t`` (else torch's generator does)."""
        return t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() and t.dim() == 2

    def __call__(self, out: torch.Tensor, keys: Sequence[int], offsets: Sequence[int], uniform: bool = False,
                 num_threads: int | None = None) -> torch.Tensor:
        """Fill row r of ``out`` ([rows, cols], contiguous float32 on the CPU) with elements ``offsets[r]`` ..
        ``offsets[r] + cols - 1`` of the stream at ``keys[r]`` (in [0, 2**64)): Exp(1) numbers, or with
        ``uniform`` the uniforms in (0, 1) they come from."""
        if not self.takes(out):
            raise ValueError(f"sample noise kernel: out is {out.dtype} {tuple(out.shape)} on {out.device}; "
                             "expected a contiguous 2-d float32 CPU tensor")
        rows = out.shape[0]
        if len(keys) != rows or len(offsets) != rows:
            raise ValueError(f"sample noise kernel: {len(keys)} keys and {len(offsets)} offsets for {rows} rows")
        for key in keys:
            if not 0 <= key < 1 << 64:
                raise ValueError(f"sample noise kernel: key {key} outside [0, 2**64)")
        if any(o < 0 for o in offsets):
            raise ValueError(f"sample noise kernel: a negative offset in {list(offsets)}")
        threads = torch.get_num_threads() if num_threads is None else num_threads
        self._fn(out.data_ptr(), rows, out.shape[1], (ctypes.c_uint64 * rows)(*keys),
                 (ctypes.c_int64 * rows)(*offsets), UNIFORM if uniform else EXPONENTIAL, threads)
        return out


@functools.cache
def _kernel(isa: str) -> SampleNoiseKernel | None:
    lib = native.load("sample_noise", isa)
    return None if lib is None else SampleNoiseKernel(lib)


def sample_noise_kernel(isa: str | None = None) -> SampleNoiseKernel | None:
    """The compiled kernel for ``isa`` (default: the engine's variant), or ``None`` where native kernels are off
    or unavailable (see :mod:`tandem.native`)."""
    if not native.enabled():
        return None
    return _kernel(native.default_isa() if isa is None else isa)
