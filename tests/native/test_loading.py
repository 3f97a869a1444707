"""Loading a native kernel library leaves the loading thread's floating-point modes alone: the libraries are
built with ``-ffast-math``, whose startup code (GCC < 13) would turn on flush-to-zero for the thread that
loads them, and torch and the tests in that thread need subnormals."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import torch

from tandem import native


def _subnormal_survives() -> bool:
    tiny = struct.unpack("<f", struct.pack("<I", 1))[0]  # the smallest positive float32 subnormal
    return bool((torch.tensor([tiny]) * 1.0).item() != 0.0)


def test_loading_keeps_subnormals(tmp_path: Path) -> None:
    assert _subnormal_survives()
    cc = native._compiler()
    if cc is None:
        return  # nothing native can be loaded here, so nothing can change the modes
    src = tmp_path / "fm.c"
    src.write_text("int tandem_fm_probe(void) { return 1; }\n")
    so = tmp_path / "fm.so"
    subprocess.run([cc, "-O2", "-ffast-math", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    lib = native._open_keeping_fp_env(so)
    assert lib.tandem_fm_probe() == 1
    assert _subnormal_survives()
    for name in ("small_linear", "decode_forward", "paged_attention"):
        native.load(name)
        assert _subnormal_survives(), name
