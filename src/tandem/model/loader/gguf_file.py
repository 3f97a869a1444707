"""A minimal reader for the GGUF container: metadata, tensor index, and raw tensor bytes.

Why not ``gguf.GGUFReader``: it builds a numpy memmap view for every part of every metadata
string, which takes about 6 s on the default model's 98k tokenizer strings. Parsing the same
header with ``struct`` takes about 0.1 s, which keeps ``load_tokenizer`` fast. The layout (v2/v3,
little-endian) is:

    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count x (string key, u32 value_type, value)
    tensor_count x (string name, u32 n_dims, n_dims x u64 dims, u32 ggml_type, u64 offset)
    padding to ``general.alignment`` (default 32), then the tensor data

A parsed header is kept per file (path, inode, size and modification time; the last ``_HEADER_CACHE`` files):
an engine opens its model's file three times while it starts (tokenizer, arguments, weights), and the default
model's 49,152 tokens and merges take ~0.35 s of Python to parse each time (Gemma 3's 262,144 more). The
metadata is shared between those opens, read-only (a ``MappingProxyType``); each open maps the file anew.
``GGUFFile.key`` names the file as that cache does.

Strings are a u64 byte length followed by UTF-8 bytes; arrays are a u32 element type, a u64
count, then the elements. ``dims`` lists the innermost (contiguous) axis first; tandem stores
shapes row-major, i.e. reversed.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from gguf import GGUFValueType

from tandem.model.loader.quants import storage_nbytes

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_HEADER_CACHE = 4  # files whose parsed header is kept


class PerFileCache:
    """What was built from a file, for the last ``size`` files (keyed by ``GGUFFile.key``), thread-safe. A value is
    built outside the lock: two first builds of one file race harmlessly, the first stored wins."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = build()
        with self._lock:
            value = self._items.setdefault(key, value)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


_headers = PerFileCache(_HEADER_CACHE)

# value type -> (struct format, numpy dtype) for the fixed-size scalar types
_SCALARS: dict[int, tuple[str, str]] = {
    GGUFValueType.UINT8: ("<B", "<u1"),
    GGUFValueType.INT8: ("<b", "<i1"),
    GGUFValueType.UINT16: ("<H", "<u2"),
    GGUFValueType.INT16: ("<h", "<i2"),
    GGUFValueType.UINT32: ("<I", "<u4"),
    GGUFValueType.INT32: ("<i", "<i4"),
    GGUFValueType.FLOAT32: ("<f", "<f4"),
    GGUFValueType.BOOL: ("<?", "<u1"),
    GGUFValueType.UINT64: ("<Q", "<u8"),
    GGUFValueType.INT64: ("<q", "<i8"),
    GGUFValueType.FLOAT64: ("<d", "<f8"),
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # row-major: GGUF's dims reversed
    ggml_type: int
    offset: int  # absolute byte offset of the data in the file
    nbytes: int


class _Cursor:
    """Sequential little-endian decoding over the mapped file, with errors naming the file."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error as exc:
            raise ValueError(f"{self.path}: truncated GGUF header at byte {self.pos}") from exc
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        raw = self.buf[self.pos : self.pos + n]
        if len(raw) != n:
            raise ValueError(f"{self.path}: truncated GGUF string at byte {self.pos}")
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype][0])
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in _SCALARS:  # numeric arrays in one read
                dtype = np.dtype(_SCALARS[etype][1])
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
                self.pos += count * dtype.itemsize
                values = arr.tolist()
                return [bool(v) for v in values] if etype == GGUFValueType.BOOL else values
            return [self.value(etype, key) for _ in range(count)]
        raise ValueError(f"{self.path}: metadata key {key!r} has unknown value type {vtype}")


@dataclass(frozen=True, eq=False)
class GGUFFile:
    path: Path
    version: int
    metadata: Mapping[str, Any]
    tensors: Mapping[str, GGUFTensorInfo]  # in file order
    _buffer: mmap.mmap
    # (resolved path, device, inode, size, mtime): which file, as the header cache knows it; other per-file caches
    # (the tokenizer's backend, loader/tokenizer_gguf.py) key on it too
    key: tuple[Any, ...]

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        path = Path(path)
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            try:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # empty file
                raise ValueError(f"{path}: not a GGUF file (empty)") from exc
        key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        version, metadata, tensors = _headers.get(key, lambda: cls._parse(path, buf))
        return cls(path, version, metadata, tensors, buf, key)

    @staticmethod
    def _parse(path: Path, buf: mmap.mmap) -> tuple[int, Mapping[str, Any], Mapping[str, GGUFTensorInfo]]:
        if buf[:4] != _MAGIC:
            raise ValueError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
        cur = _Cursor(buf, path)
        cur.pos = 4
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise ValueError(
                f"{path}: unsupported GGUF version {version} (big-endian or pre-v2 files are "
                "not supported)"
            )
        n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.unpack("<I"), key)
        raw_infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.unpack("<Q") for _ in range(cur.unpack("<I"))]
            raw_infos.append((name, tuple(reversed(dims)), cur.unpack("<I"), cur.unpack("<Q")))
        alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        data_start = -(-cur.pos // alignment) * alignment
        tensors: dict[str, GGUFTensorInfo] = {}
        for name, shape, ggml_type, offset in raw_infos:
            nbytes = storage_nbytes(ggml_type, shape, name)
            start = data_start + offset
            if start + nbytes > len(buf):
                raise ValueError(f"{path}: data of tensor {name!r} runs past the end of the file")
            tensors[name] = GGUFTensorInfo(name, shape, ggml_type, start, nbytes)
        return version, MappingProxyType(metadata), MappingProxyType(tensors)

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of tensor ``name`` (a read-only view of the mapped file)."""
        info = self.tensors.get(name)
        if info is None:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        return np.frombuffer(self._buffer, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ValueError(f"{self.path}: missing GGUF metadata field {key!r}")
        return self.metadata[key]
