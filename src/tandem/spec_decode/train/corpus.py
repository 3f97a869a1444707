"""Teacher-forced training text: the Python standard library's own source files, cut into token chunks.

EAGLE's heads are trained on a fixed corpus, not on the target's generations: what the head learns is the
*target's* next-token prediction (its greedy token and its feature at every position, captured by running
the target over the text), so any text in the target's domain teaches it. The generated responses
(``data.py``) are few on a 2-core CPU (~20 k tokens in 20 minutes); the standard library's source is
millions of tokens of real Python, available offline, and a prefill-only capture of it runs an order of
magnitude faster than generation. HumanEval is not part of the standard library: it stays held out.

Deterministic for a given Python: files are listed in sorted order, chunked, and the chunk order is a
seeded shuffle. A target whose tokenizer starts every text with BOS (Gemma) gets it at the start of every
chunk (``prefix``): the features are captured from position 0 of each chunk, and the target never sees a
sequence without its BOS at inference.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

# Trees that are tests, GUI demos, vendored packages or generated tables, not representative code.
SKIP_DIRS = frozenset(
    "test tests idle_test idlelib tkinter turtledemo lib2to3 ensurepip site-packages dist-packages "
    "__pycache__ encodings pydoc_data config-3".split()
)
MIN_CHUNK = 64  # a file's tail shorter than this is dropped


def stdlib_source_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files under ``root`` (default: this Python's), sorted."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).parts
        if any(part in SKIP_DIRS or part.startswith("config-") for part in rel[:-1]):
            continue
        if rel[-1].startswith("test_"):
            continue
        files.append(path)
    return files


def _chunks(ids: list[int], chunk_tokens: int) -> Iterator[list[int]]:
    for start in range(0, len(ids), chunk_tokens):
        piece = ids[start : start + chunk_tokens]
        if len(piece) >= MIN_CHUNK:
            yield piece


def stdlib_source_chunks(
    encode: Callable[[str], list[int]],
    num_tokens: int,
    chunk_tokens: int = 256,
    seed: int = 0,
    root: str | Path | None = None,
    prefix: Sequence[int] = (),
) -> list[list[int]]:
    """Token chunks of at most ``chunk_tokens`` from the standard library's source, about ``num_tokens``
    in all (fewer if the library is smaller), in a seeded order. Each chunk starts with ``prefix`` (the
    target's BOS, if its tokenizer adds one; ``encode`` must not add it), which counts towards both sizes.

    Files are read in a seeded order and tokenised only until enough chunks are collected, so a small
    request does not tokenise the whole library.
    """
    if num_tokens <= 0:
        return []
    if chunk_tokens < MIN_CHUNK:
        raise ValueError(f"corpus chunk_tokens must be >= {MIN_CHUNK}, got {chunk_tokens}")
    files = stdlib_source_files(root)
    random.Random(seed).shuffle(files)
    chunks: list[list[int]] = []
    total = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for piece in _chunks(encode(text), chunk_tokens - len(prefix)):
            chunks.append([*prefix, *piece])
            total += len(prefix) + len(piece)
            if total >= num_tokens:
                return chunks
    return chunks
