"""Hyper-parameters of a model without reading its weights (``tandem config``, engine planning)."""

from __future__ import annotations

from pathlib import Path

from tandem.model.loader.gguf import gguf_model_args
from tandem.model.loader.gguf_file import GGUFFile
from tandem.model.loader.hf import hf_model_args
from tandem.model.loader.registry import resolve_model
from tandem.model.model_args import ModelArgs


def load_model_args(model: str | Path) -> ModelArgs:
    path = resolve_model(model)
    if path.is_dir():
        return hf_model_args(path)
    return gguf_model_args(GGUFFile.open(path))
