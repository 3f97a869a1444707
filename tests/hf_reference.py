"""transformers as the reference model, loaded from a GGUF file faster: the same file less its vocabulary arrays.

transformers reads a GGUF file with gguf-py's ``GGUFReader``, which builds a numpy view for every part of every
metadata string, and it reads the file twice (once for the config, once for the weights). On Gemma 3's 262,144
tokens that is ~40 of the ~47 s a model load takes on a two-core machine (SmolLM2's 49,152: ~5 of ~15 s); the
model needs none of those arrays. ``hf_model`` therefore hands transformers a copy of the file in a temporary
folder with the ``tokenizer.ggml.*`` *arrays* (tokens, scores, token types, merges) left out and everything else
byte for byte: every other metadata field (the tokenizer's scalar fields such as the BOS id included), every
tensor's index entry and the whole tensor data section. Where the file has no ``<arch>.vocab_size`` field,
transformers takes the vocabulary size from the token list, so the copy states it (the token list's length).
The config and every weight transformers builds from the copy equal those it builds from the original
(tests/test_hf_reference.py checks both on the default model).

The copy is parsed here with ``struct`` alone, independently of tandem's GGUF reader, so the reference does not
lean on the code it checks. Tokenizer references keep loading the original file (``hf_tokenizer``).

Two more costs are gguf-py's, removed without changing what it returns (``_faster_gguf``, around every load here):
- transformers maps tensor names by calling ``gguf.get_tensor_name_map(arch, layers)`` once per module of the
  model (~400 calls for SmolLM2), and each call builds the whole name table anew: ~12.5 of the ~20 s a SmolLM2
  load took on the Zen 3 kind. The table depends on its two arguments only and transformers only reads it, so
  the calls are memoized.
- ``GGUFReader`` slices its file as a ``numpy.memmap``, whose Python-level ``__getitem__`` and
  ``__array_finalize__`` run for every part of every metadata string: 22 s to read Gemma 3's file there. The
  reader here slices a plain ``ndarray`` view of the same mapping (the same bytes, fields and tensors): 7.6 s.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

# GGUF value types: fixed sizes, then string (8) and array (9); uint32 is 4.
_FIXED_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_DEFAULT_ALIGNMENT = 32

_copies: dict[Path, Path] = {}
_lock = threading.Lock()
_folder: Path | None = None


def _string(buf: memoryview, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return bytes(buf[pos + 8 : pos + 8 + n]).decode(), pos + 8 + n


def _skip_value(buf: memoryview, pos: int, vtype: int) -> int:
    if vtype in _FIXED_SIZE:
        return pos + _FIXED_SIZE[vtype]
    if vtype == _STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype == _ARRAY:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _FIXED_SIZE:
            return pos + count * _FIXED_SIZE[etype]
        for _ in range(count):
            pos = _skip_value(buf, pos, etype)
        return pos
    raise ValueError(f"unknown GGUF value type {vtype}")


def write_without_vocabulary(src: Path, dst: Path) -> None:
    """Write ``src`` to ``dst`` less its ``tokenizer.ggml.*`` arrays (and with ``<arch>.vocab_size``)."""
    buf = memoryview(src.read_bytes())
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{src}: not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, kept, keys = 24, [], set()
    arch, vocab, alignment = "", None, _DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        start = pos
        key, pos = _string(buf, pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        end = _skip_value(buf, pos + 4, vtype)
        if key == "general.architecture":
            arch = _string(buf, pos + 4)[0]
        elif key == "general.alignment":
            alignment = struct.unpack_from("<I", buf, pos + 4)[0]
        elif key == "tokenizer.ggml.tokens":
            vocab = struct.unpack_from("<IQ", buf, pos + 4)[1]
        if not (vtype == _ARRAY and key.startswith("tokenizer.ggml.")):
            kept.append(bytes(buf[start:end]))
            keys.add(key)
        pos = end
    infos_start = pos
    for _ in range(n_tensors):
        pos = _string(buf, pos)[1]
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * n_dims + 4 + 8  # dims, ggml type, offset into the data section
    infos = bytes(buf[infos_start:pos])
    data_start = -(-pos // alignment) * alignment
    if f"{arch}.vocab_size" not in keys and vocab is not None:
        name = f"{arch}.vocab_size".encode()
        kept.append(struct.pack("<Q", len(name)) + name + struct.pack("<II", _UINT32, vocab))
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kept)) + b"".join(kept) + infos
    with open(dst, "wb") as f:
        f.write(head)
        f.write(b"\0" * (-len(head) % alignment))  # tensor offsets are relative to the aligned data start
        f.write(buf[data_start:])


def without_vocabulary(src: Path) -> Path:
    """The copy of ``src`` less its vocabulary arrays, written once per test session."""
    global _folder
    src = Path(src).resolve()
    with _lock:
        if src not in _copies:
            if _folder is None:
                _folder = Path(tempfile.mkdtemp(prefix="tandem-hf-reference-"))
                atexit.register(shutil.rmtree, _folder, ignore_errors=True)
            dst = _folder / src.name
            write_without_vocabulary(src, dst)
            _copies[src] = dst
        return _copies[src]


_name_maps: dict[tuple[Any, int], Any] = {}


@contextlib.contextmanager
def _faster_gguf() -> Iterator[None]:
    """gguf-py's reader on a plain array view and its tensor-name tables memoized, while transformers loads."""
    import gguf

    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map

    class PlainReader(original_reader):  # type: ignore[misc, valid-type]
        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            if type(self.data) is not np.ndarray:
                self.data = self.data.view(np.ndarray)  # the same mapping, sliced without memmap's hooks
            return super()._get(offset, dtype, count, override_order)

    def name_map(arch: Any, n_blocks: int) -> Any:
        key = (arch, n_blocks)
        if key not in _name_maps:
            _name_maps[key] = original_map(arch, n_blocks)
        return _name_maps[key]

    with _lock:
        gguf.GGUFReader, gguf.get_tensor_name_map = PlainReader, name_map
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = original_reader, original_map


def hf_model(src: Path, cls_name: str = "AutoModelForCausalLM", **kwargs: Any) -> Any:
    """transformers' model (``transformers.<cls_name>``) from the GGUF file ``src``, in eval mode."""
    import transformers

    copy = without_vocabulary(src)
    cls = getattr(transformers, cls_name)
    with _faster_gguf():
        return cls.from_pretrained(str(copy.parent), gguf_file=copy.name, **kwargs).eval()


def hf_tokenizer(src: Path) -> Any:
    """transformers' tokenizer from the GGUF file ``src`` (the whole file: the vocabulary is what it needs)."""
    import transformers

    src = Path(src)
    with _faster_gguf():
        return transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
