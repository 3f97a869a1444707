"""Python side of ``ngram_lookup.c``: n-gram prompt lookup over the runner's token table on the CPU, for
:class:`tandem.spec_decode.ngram.NgramProposer` (whose ``propose_ngram`` torch ops are the reference and the
path elsewhere). The C code trusts types and strides, checked here; it checks slots and lengths itself."""

from __future__ import annotations

import ctypes
import functools

import torch

from tandem import native

_ABI = 1
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


class NgramLookupKernel:
    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.tandem_ngram_lookup_abi.restype = ctypes.c_int
        if lib.tandem_ngram_lookup_abi() != _ABI:
            raise RuntimeError("ngram_lookup library ABI mismatch; clear $TANDEM_CACHE_DIR/native")
        self._lookup = lib.tandem_ngram_lookup
        self._lookup.argtypes = [_i64, _ptr, _i64, _i64, _i64, _ptr, _ptr, _i64, _i64, _i64, _ptr, _i64, _ptr]
        self._lookup.restype = ctypes.c_int

    def __call__(self, tokens: torch.Tensor, num_tokens: torch.Tensor, slots: torch.Tensor, width: int,
                 min_n: int, max_n: int, max_drafts: torch.Tensor, k: int) -> torch.Tensor:
        """Drafts ``[B, k]`` (-1 padded) for rows ``slots`` of ``tokens`` ``[S, W]`` (lengths ``num_tokens``
        ``[S]``), searched within each row's last ``width`` tokens: ``propose_ngram`` over those rows."""
        ints = (tokens, num_tokens, slots, max_drafts)
        if (any(t.dtype != torch.int64 or t.device.type != "cpu" for t in ints) or tokens.dim() != 2
                or tokens.stride(1) != 1 or num_tokens.dim() != 1 or num_tokens.shape[0] != tokens.shape[0]
                or slots.dim() != 1 or max_drafts.shape != slots.shape or not 1 <= min_n <= max_n or k < 0):
            raise ValueError(f"ngram lookup: tokens {tuple(tokens.shape)} {tokens.dtype}, slots {tuple(slots.shape)}, "
                             f"max_drafts {tuple(max_drafts.shape)}, n {min_n}..{max_n}, k {k}")
        num_tokens, slots, max_drafts = num_tokens.contiguous(), slots.contiguous(), max_drafts.contiguous()
        out = torch.empty(slots.shape[0], k, dtype=torch.int64)
        rc = self._lookup(slots.shape[0], tokens.data_ptr(), tokens.stride(0), tokens.shape[0], tokens.shape[1],
                          num_tokens.data_ptr(), slots.data_ptr(), width, min_n, max_n, max_drafts.data_ptr(), k,
                          out.data_ptr())
        if rc != 0:
            raise ValueError(f"ngram lookup: a slot outside the {tokens.shape[0]} rows, or a row longer than the "
                             f"window ({width}) or the table ({tokens.shape[1]})")
        return out


@functools.cache
def _kernel() -> NgramLookupKernel | None:
    lib = native.load("ngram_lookup")
    return None if lib is None else NgramLookupKernel(lib)


def ngram_lookup_kernel() -> NgramLookupKernel | None:
    """The compiled kernel, or ``None`` where native kernels are unavailable (see :mod:`tandem.native`)."""
    return _kernel() if native.enabled() else None
