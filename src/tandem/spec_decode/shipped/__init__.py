"""Drafters shipped for known targets, and finding them.

Next to this file, one directory per drafter, produced by ``tandem train-drafter`` (see ``README.md`` here
for the exact commands and their logs), named ``<target>-<method>`` after the target's known model name
(``tandem.model.loader.KNOWN_MODELS``) and found by that name alone: a target of :data:`SHIPPED` gets every
method whose directory is present (a method without one raises the proposer's "no head is shipped" error):
- ``<target>-eagle/``, ``<target>-eagle3/``: heads in the public EAGLE / EAGLE-3 layout (fp16), used as is;
- ``<target>-mtp/``: the MTP layer alone (``mtp_layer.safetensors``, DeepSeek-V3 names) and the config keys
  it adds. The "target checkpoint with an MTP layer" is assembled from it on first use, locally and
  deterministically, under ``$TANDEM_CACHE_DIR/mtp/`` — like the shipped draft model (``make_draft.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tandem.model.loader import KNOWN_MODELS, Checkpoint, resolve_model

SHIPPED_DIR = Path(__file__).resolve().parent
METHODS = ("eagle", "eagle3", "mtp")
# target name -> drafter directory name per method
SHIPPED: dict[str, dict[str, str]] = {
    target: {m: f"{target}-{m}" for m in METHODS} for target in ("smollm2-135m-instruct", "gemma-3-270m")
}
MTP_LAYER_FILE = "mtp_layer.safetensors"
MTP_CONFIG_FILE = "mtp_config.json"


def known_target_name(checkpoint: Checkpoint | Path | None, names: Iterable[str]) -> str | None:
    """Which of the known model ``names`` ``checkpoint`` (or the model file or directory itself, before any
    weights are read) was loaded from, by its resolved file, if any.

    A model assembled into the cache is compared by file name first, so a lookup never assembles one."""
    if checkpoint is None:
        return None
    source = (checkpoint if isinstance(checkpoint, Path) else checkpoint.source).resolve()
    for name in sorted(names):
        entry = KNOWN_MODELS.get(name)
        if entry is not None and entry.filename and entry.filename != source.name:
            continue
        try:
            if resolve_model(name) == source:
                return name
        except (FileNotFoundError, ValueError):
            continue
    return None


def _target_name(checkpoint: Checkpoint | Path | None) -> str | None:
    return known_target_name(checkpoint, SHIPPED)


def shipped_head(name: str, method: str) -> Path | None:
    """``name`` as a shipped drafter directory name (e.g. ``smollm2-135m-instruct-eagle``), if it is one."""
    for entries in SHIPPED.values():
        if entries.get(method) == name.lower():
            path = SHIPPED_DIR / entries[method]
            return path if path.is_dir() else None
    return None


def shipped_head_for_target(checkpoint: Checkpoint | Path | None, method: str) -> Path | None:
    name = _target_name(checkpoint)
    if name is None or method not in SHIPPED[name]:
        return None
    path = SHIPPED_DIR / SHIPPED[name][method]
    return path if (path / "config.json").is_file() else None


def shipped_mtp_for_target(checkpoint: Checkpoint | None) -> Path | None:
    """The assembled target-with-MTP checkpoint directory for a shipped target (built on first use)."""
    name = _target_name(checkpoint)
    if name is None or "mtp" not in SHIPPED[name]:
        return None
    layer_dir = SHIPPED_DIR / SHIPPED[name]["mtp"]
    if not (layer_dir / MTP_LAYER_FILE).is_file():
        return None
    from tandem.spec_decode.make_draft import cache_dir

    out = cache_dir() / "mtp" / SHIPPED[name]["mtp"]
    stamp = _stamp(layer_dir)
    if not (out / "mtp_source.txt").is_file() or (out / "mtp_source.txt").read_text() != stamp:
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        assemble_mtp_checkpoint(
            name,
            load_file(str(layer_dir / MTP_LAYER_FILE)),
            json.loads((layer_dir / MTP_CONFIG_FILE).read_text()),
            tmp,
        )
        (tmp / "mtp_source.txt").write_text(stamp)
        if out.exists():
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        tmp.replace(out)
    return out


def _stamp(layer_dir: Path) -> str:
    """The shipped layer's content hash: a retrained layer (same size, any mtime) rebuilds the cache."""
    import hashlib

    return hashlib.sha256((layer_dir / MTP_LAYER_FILE).read_bytes()).hexdigest()


def assemble_mtp_checkpoint(
    target: str | Path,
    mtp_tensors: dict[str, torch.Tensor],
    config_keys: dict[str, object],
    out_dir: str | Path,
) -> Path:
    """Write ``target`` as a Hugging Face checkpoint (float32, exact) plus an MTP layer: the target's
    tensors in ``model.safetensors``, the MTP layer (DeepSeek-V3 names) in ``mtp.safetensors``, an index
    over both, and ``config.json`` with ``num_nextn_predict_layers``."""
    from tandem.model.loader.model_info import load_model_args
    from tandem.spec_decode.make_draft import make_draft

    args = load_model_args(target)
    out = make_draft(str(target), out_dir, args.num_hidden_layers)
    save_file(
        {n: t.contiguous() for n, t in mtp_tensors.items()}, str(out / "mtp.safetensors"),
        metadata={"format": "pt"},
    )
    weight_map: dict[str, str] = {}
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        weight_map |= {n: "model.safetensors" for n in f.keys()}  # noqa: SIM118
    weight_map |= {n: "mtp.safetensors" for n in mtp_tensors}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = json.loads((out / "config.json").read_text())
    config.update(config_keys)
    config.pop("tandem_draft_of", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
