"""Native CPU kernels: small C sources compiled on first use with the system C compiler, loaded by ctypes.

Why C and why at run time: a few hot loops (paged attention over short queries) cost far more as a chain
of torch ops (gather the context, pad, SDPA, scatter) than as one pass over the cache, and a plain C file
needs no torch headers, no build step at install time and no wheel per platform. The library is built
once per (source, compiler, CPU flags) into ``$TANDEM_CACHE_DIR/native/<hash>/`` (atomic rename, so
concurrent first uses are safe), and linked against the OpenMP runtime torch has already loaded
(``libgomp.so.1``), so both share one thread pool.

ISA: a library is built for one instruction set (:data:`ISA_FLAGS`): ``native`` (``-march=native``, what
this CPU has: AVX-512 where present, else AVX2), ``avx2`` (x86-64-v3: AVX2, FMA, F16C) and ``portable``
(baseline x86-64, the C code's scalar paths). The engine runs ``native`` (or ``$TANDEM_NATIVE_ISA``, read in
:func:`default_isa`); the tests run every variant this CPU can execute against the same references, so the
portable and AVX2 paths are checked on an AVX-512 machine too.

Every native kernel has a torch reference path; when no compiler is found, the build fails or
``TANDEM_NATIVE=0`` is set, :func:`load` returns ``None`` and callers use that path. Tests check each
kernel against the reference.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch  # noqa: F401  (loads torch's libgomp first, so the kernels share its OpenMP runtime)

from tandem import overrides
from tandem.cache import cache_dir

log = logging.getLogger(__name__)

_SOURCES = Path(__file__).resolve().parent
_FLAGS = ["-O3", "-ffast-math", "-fopenmp", "-fPIC", "-shared", "-std=c11"]
ISA_FLAGS = {
    "native": ["-march=native"],
    "avx2": ["-march=x86-64-v3", "-mtune=native"],
    "portable": ["-march=x86-64", "-mtune=native"],
}
# CPU flags an ISA variant needs to run (``native`` is by definition this CPU's).
_ISA_NEEDS = {"native": (), "avx2": ("avx2", "fma", "f16c", "bmi2"), "portable": ()}
_lock = threading.Lock()
_loaded: dict[tuple[str, str], ctypes.CDLL | None] = {}


# Set by configure() in a worker: the engine's resolved choice (tandem/execution.py), not this process's
# environment.
_configured: dict[str, object] = {}


def configure(enabled: bool, isa: str) -> None:
    """Fix this process's switches to the engine's resolved ones (a worker, before it builds anything)."""
    if isa not in ISA_FLAGS:
        raise ValueError(f"native ISA {isa!r}; one of {sorted(ISA_FLAGS)}")
    _configured.update(enabled=enabled, isa=isa)


def enabled() -> bool:
    """Native kernels are on unless configured off or ``TANDEM_NATIVE=0``."""
    if "enabled" in _configured:
        return bool(_configured["enabled"])
    return overrides.native_enabled()


def compiled_isa() -> str | None:
    """What the default variant compiles to on this CPU (avx512, avx2 or portable), or ``None`` where native
    kernels are off or cannot be built."""
    if load("small_linear") is None:
        return None
    isa = default_isa()
    return cpu_isa() if isa == "native" else isa


def default_isa() -> str:
    """The ISA variant the engine's kernels are built for: the configured one, ``$TANDEM_NATIVE_ISA`` or
    ``native``."""
    if "isa" in _configured:
        return str(_configured["isa"])
    isa = overrides.native_isa() or "native"
    if isa not in ISA_FLAGS:
        raise ValueError(f"TANDEM_NATIVE_ISA={isa!r}; one of {sorted(ISA_FLAGS)}")
    return isa


def runnable_isas() -> list[str]:
    """The ISA variants this CPU can execute (``native`` always; the x86 variants on x86 CPUs only)."""
    flags = set(_cpu_flags().split())
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    out = ["native"]
    for isa in ("avx2", "portable"):
        if x86 and all(f in flags for f in _ISA_NEEDS[isa]):
            out.append(isa)
    return out


def cpu_isa() -> str:
    """What ``native`` compiles to on this CPU, in the names the kernels report: avx512, avx2 or portable."""
    flags = set(_cpu_flags().split())
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= flags else "portable"


def _cache_root() -> Path:
    return cache_dir() / "native"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return ""


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _source_files() -> list[Path]:
    return sorted(f for f in _SOURCES.iterdir() if f.suffix in (".c", ".h"))


def _build(name: str, cc: str, isa: str = "native") -> Path:
    # Sources may include each other (shared headers, one kernel inside another), so every C file
    # here is part of the key: editing any of them rebuilds every library.
    sources = [f.name.encode() + b"\0" + f.read_bytes() for f in _source_files()]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(
        b"\0".join([name.encode(), *sources, version.encode(), " ".join(_FLAGS + ISA_FLAGS[isa]).encode(),
                    _cpu_flags().encode()])
    ).hexdigest()[:16]
    out_dir = _cache_root() / key
    target = out_dir / f"lib{name}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        cmd = [cc, *_FLAGS, *ISA_FLAGS[isa], "-o", tmp, str(_SOURCES / f"{name}.c"), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _open_keeping_fp_env(path: Path) -> ctypes.CDLL:
    """``ctypes.CDLL(path)`` with the loading thread's floating-point environment put back afterwards.

    A shared object linked with ``-ffast-math`` (GCC before 13 adds ``crtfastmath.o``) sets flush-to-zero and
    denormals-are-zero in the thread that loads it, so every later float computation of that thread — torch
    included — would lose subnormals. The kernels do not depend on those modes; the caller's thread keeps its
    own (glibc ``fegetenv`` / ``fesetenv`` carry the SSE control word)."""
    libc = None
    env = ctypes.create_string_buffer(64)  # fenv_t: 32 bytes on x86-64 glibc
    try:
        libc = ctypes.CDLL(None)
        if libc.fegetenv(env) != 0:
            libc = None
    except (OSError, AttributeError):
        libc = None
    try:
        return ctypes.CDLL(str(path))
    finally:
        if libc is not None:
            libc.fesetenv(env)


def load(name: str, isa: str | None = None) -> ctypes.CDLL | None:
    """The compiled library ``name`` (``native/<name>.c``) for ``isa`` (default :func:`default_isa`), or
    ``None`` where native kernels are off or cannot be built (the reason is logged once)."""
    if not enabled():
        return None
    isa = isa or default_isa()
    if isa not in ISA_FLAGS:
        raise ValueError(f"native ISA {isa!r}; one of {sorted(ISA_FLAGS)}")
    key = (name, isa)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        lib = None
        cc = _compiler()
        if cc is None:
            log.warning("native kernel %s unavailable: no C compiler (set CC); using torch ops", name)
        else:
            try:
                lib = _open_keeping_fp_env(_build(name, cc, isa))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                log.warning("native kernel %s unavailable, using torch ops: %s", name, exc)
        _loaded[key] = lib
        return lib
