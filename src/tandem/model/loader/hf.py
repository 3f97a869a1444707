"""Model hyper-parameters and weights from a Hugging Face checkpoint directory.

The directory holds ``config.json``, optionally ``generation_config.json`` (its ``eos_token_id``
may list more stop tokens than ``config.json``, e.g. chat models ending turns with ``<|im_end|>``),
and the weights as one ``model.safetensors`` or shards listed by ``model.safetensors.index.json``.
Shards are opened memory-mapped and only the tensors the model uses are read.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from tandem.model.loader.tensor_spec import Shape, check_tensors, in_layers, is_ignored
from tandem.model.model_args import ModelArgs

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(data, dict):
        # A malformed file, not a caller passing the wrong type: ValueError like other bad files.
        kind = type(data).__name__
        raise ValueError(f"{path}: expected a JSON object, got {kind}")  # noqa: TRY004
    return data


def generation_eos_ids(directory: Path) -> tuple[int, ...]:
    """``eos_token_id`` of ``generation_config.json`` as a tuple (empty if absent)."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return ()
    eos = read_json(path).get("eos_token_id")
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))


def hf_model_args(directory: Path) -> ModelArgs:
    """``ModelArgs`` from ``config.json``, with ``generation_config.json``'s eos ids merged in."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory}: no config.json (not a Hugging Face model directory)")
    args = ModelArgs.from_hf_config(read_json(config_path), source=str(config_path))
    extra = generation_eos_ids(directory)
    if extra:
        merged = tuple(dict.fromkeys(args.eos_token_ids + extra))
        args = dataclasses.replace(args, eos_token_ids=merged)
    return args


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of the checkpoint, in a stable order."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: missing or empty 'weight_map'")
        files = [directory / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"{index}: lists shard {f.name!r}, which does not exist")
        return files
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{directory}: no *.safetensors weights (tandem does not read .bin)"
        )
    return files


def _tensor_locations(files: list[Path]) -> tuple[dict[str, Path], dict[str, Shape]]:
    """Where each tensor lives and its shape, from the safetensors headers alone."""
    where: dict[str, Path] = {}
    shapes: dict[str, Shape] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name in where:
                    raise ValueError(f"{path}: tensor {name!r} also appears in {where[name].name}")
                where[name] = path
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return where, shapes


def load_hf_tensors(
    directory: Path, args: ModelArgs, dtype: torch.dtype, num_layers: int | None = None
) -> tuple[dict[str, torch.Tensor], list[Path]]:
    """The model's tensors (HF names, ``dtype``, CPU) and the files they came from; with ``num_layers``
    the decoder layers from that index on are left unread."""
    files = weight_files(directory)
    where, shapes = _tensor_locations(files)
    # A tied checkpoint may still store lm_head.weight; the model reads the embedding instead.
    optional = ["lm_head.weight"] if args.tie_word_embeddings else []
    if read_json(directory / "config.json").get("num_nextn_predict_layers"):
        # DeepSeek-V3-style MTP layers (indices past the last decoder layer) belong to the MTP drafter.
        extra = re.compile(r"model\.layers\.(\d+)\.")
        optional += [
            n for n in where
            if (m := extra.match(n)) is not None and int(m.group(1)) >= args.num_hidden_layers
        ]
    index = directory / INDEX_FILE
    source = index if index.is_file() else files[0] if len(files) == 1 else directory
    check_tensors(shapes, args, source, optional=optional)
    wanted = [n for n in where if not is_ignored(n) and n not in optional and in_layers(n, num_layers)]
    out: dict[str, torch.Tensor] = {}
    for path in files:
        names = [n for n in wanted if where[n] == path]
        if not names:
            continue
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                out[name] = f.get_tensor(name).to(dtype).contiguous()
    return out, files
