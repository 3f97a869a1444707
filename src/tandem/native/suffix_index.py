"""Python side of ``suffix_index.c``: suffix decoding's index and drafting loop (spec_decode/suffix.py) in C.

``NativeSuffixIndex`` has the interface of the pure-Python ``SuffixIndex`` (``add``, ``counts``, ``len``) and
the same contents; ``draft`` runs ``SuffixProposer.draft``'s loop over two native indexes. Token lists cross
as ``array('i')`` buffers: an addition passes only the tokens its contexts reach (``depth`` before ``start``),
a draft only the last ``depth``.
"""

from __future__ import annotations

import ctypes
from array import array

from tandem import native

_ABI = 1
_i64, _ptr, _int, _dbl = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_double


def load(isa: str | None = None) -> ctypes.CDLL | None:
    """The library with its signatures set, or ``None`` where native kernels are off or cannot be built."""
    lib = native.load("suffix_index", isa)
    if lib is None:
        return None
    if not getattr(lib, "_tandem_sx_ready", False):
        lib.sx_abi.restype = _int
        if lib.sx_abi() != _ABI:
            raise RuntimeError(f"suffix_index.c ABI {lib.sx_abi()}, expected {_ABI}")
        lib.sx_new.argtypes, lib.sx_new.restype = [_int], _ptr
        lib.sx_free.argtypes, lib.sx_free.restype = [_ptr], None
        lib.sx_live.argtypes, lib.sx_live.restype = [_ptr], _i64
        lib.sx_slots.argtypes, lib.sx_slots.restype = [_ptr], _i64
        lib.sx_add.argtypes, lib.sx_add.restype = [_ptr, _ptr, _i64, _i64, _int], _int
        lib.sx_counts.argtypes = [_ptr, ctypes.c_uint64, _ptr, _ptr, _i64]
        lib.sx_counts.restype = _i64
        lib.sx_draft.argtypes = [_ptr, _ptr, _ptr, _i64, _int, _int, _dbl, _dbl, _ptr]
        lib.sx_draft.restype = _int
        lib._tandem_sx_ready = True
    return lib


class NativeSuffixIndex:
    """Context hash -> {next token: count}, held in C (``SuffixIndex``'s contents, about a third of its memory:
    ~12 bytes a slot at most 70 % full, 12 a continuation)."""

    def __init__(self, lib: ctypes.CDLL, depth: int) -> None:
        self.depth = depth
        self._lib = lib
        self._handle = lib.sx_new(depth)
        if not self._handle:
            raise MemoryError("suffix index: out of memory")

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.sx_free(handle)

    def add(self, tokens: list[int], start: int, sign: int = 1) -> None:
        """Count (or with ``sign=-1`` uncount) the tokens at positions ``start ..`` after each of their contexts."""
        lo = max(start - self.depth, 0)  # the contexts of positions >= start reach back no further
        if max(start, 1) >= len(tokens):
            return
        buf = array("i", tokens[lo:])
        if self._lib.sx_add(self._handle, buf.buffer_info()[0], len(buf), start - lo, sign) != 0:
            raise MemoryError("suffix index: out of memory")

    def counts(self, key: int) -> dict[int, int] | None:
        n = self._lib.sx_counts(self._handle, key, None, None, 0)
        if n == 0:
            return None
        toks, cnts = array("i", [0]) * n, array("i", [0]) * n
        self._lib.sx_counts(self._handle, key, toks.buffer_info()[0], cnts.buffer_info()[0], n)
        return dict(zip(toks, cnts))

    def __len__(self) -> int:
        return self._lib.sx_live(self._handle)

    def slots(self) -> int:
        """The table's size in slots (a power of two; memory ~12 bytes a slot plus 12 a continuation)."""
        return self._lib.sx_slots(self._handle)


def draft(own: NativeSuffixIndex, glob: NativeSuffixIndex | None, tokens: list[int], limit: int, own_weight: int,
          factor: float, min_prob: float) -> list[int]:
    """``SuffixProposer.draft`` over two native indexes (``glob`` may be ``None``)."""
    if limit <= 0:
        return []
    buf = array("i", tokens[-own.depth:])
    out = array("i", [0]) * limit
    n = own._lib.sx_draft(own._handle, glob._handle if glob is not None else None, buf.buffer_info()[0], len(buf),
                          limit, own_weight, factor, min_prob, out.buffer_info()[0])
    if n < 0:
        raise MemoryError("suffix index: out of memory")
    return out[:n].tolist()
