"""``load_checkpoint``: one call from a model argument to hyper-parameters, weights and tokenizer.

Whatever the source format, the result is the same: ``ModelArgs``, a dict of CPU tensors under
Hugging Face names in the requested dtype, and tandem's ``Tokenizer``. The model-side stop ids
(``ModelArgs.eos_token_ids``) and the tokenizer's ``eos_token_ids`` are merged so that either can
be used to stop generation.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from tandem.model.block_quant import BlockQuantWeight
from tandem.model.loader.gguf import gguf_model_args, load_gguf_tensors
from tandem.model.loader.gguf_file import GGUFFile
from tandem.model.loader.hf import hf_model_args, load_hf_tensors
from tandem.model.loader.registry import resolve_model
from tandem.model.loader.tokenizer import Tokenizer
from tandem.model.loader.tokenizer_gguf import gguf_tokenizer
from tandem.model.loader.tokenizer_hf import hf_tokenizer
from tandem.model.model_args import ModelArgs

_HASH_CHUNK = 1 << 22


@dataclass(frozen=True, eq=False)
class Checkpoint:
    args: ModelArgs
    # HF names, requested dtype, CPU; block-quantized matrices as BlockQuantWeight (keep_quantized)
    tensors: dict[str, torch.Tensor | BlockQuantWeight]
    tokenizer: Tokenizer
    source: Path  # the .gguf file or the checkpoint directory
    weight_files: tuple[Path, ...] = field(default=(), repr=False)

    @cached_property
    def _sha256(self) -> str:
        digest = hashlib.sha256()
        for path in self.weight_files or (self.source,):
            with open(path, "rb") as f:
                while chunk := f.read(_HASH_CHUNK):
                    digest.update(chunk)
        return digest.hexdigest()

    def file_sha256(self) -> str:
        """SHA-256 of the weight file, or of the shards' bytes concatenated in name order;
        computed on first use (it reads every byte) and cached."""
        return self._sha256


def _merge_stop_ids(args: ModelArgs, tokenizer: Tokenizer) -> ModelArgs:
    merged = tuple(dict.fromkeys((*args.eos_token_ids, *sorted(tokenizer.eos_token_ids))))
    if merged == args.eos_token_ids:
        return args
    return dataclasses.replace(args, eos_token_ids=merged)


def load_tokenizer(model: str | Path) -> Tokenizer:
    """The tokenizer of ``model`` without reading any weights."""
    path = resolve_model(model)
    if path.is_dir():
        return hf_tokenizer(path)
    return gguf_tokenizer(GGUFFile.open(path))


def load_checkpoint(
    model: str | Path, dtype: torch.dtype = torch.float32, keep_quantized: bool = False,
    num_layers: int | None = None,
) -> Checkpoint:
    """Hyper-parameters, weights (dequantized / cast to ``dtype``; with ``keep_quantized`` a GGUF file's
    block-quantized matrices stay in their blocks, model/block_quant.py) and tokenizer of ``model``.

    ``num_layers`` reads only the first that many decoder layers' tensors (and everything outside the layers):
    for exporting a prefix of the model (``make_draft``); ``args`` still describe the whole model."""
    if not dtype.is_floating_point:
        raise ValueError(f"load_checkpoint: dtype must be a floating-point type, got {dtype}")
    if num_layers is not None and num_layers < 1:
        raise ValueError(f"load_checkpoint: num_layers must be at least 1, got {num_layers}")
    path = resolve_model(model)
    if path.is_dir():
        args = hf_model_args(path)
        tensors, files = load_hf_tensors(path, args, dtype, num_layers)
        tokenizer = hf_tokenizer(path)
    else:
        gf = GGUFFile.open(path)
        args = gguf_model_args(gf)
        tensors, files = load_gguf_tensors(gf, args, dtype, keep_quantized, num_layers), [path]
        tokenizer = gguf_tokenizer(gf)
    if tokenizer.vocab_size > args.vocab_size:
        raise ValueError(
            f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the model's embedding only "
            f"{args.vocab_size} rows"
        )
    return Checkpoint(
        args=_merge_stop_ids(args, tokenizer),
        tensors=tensors,
        tokenizer=tokenizer,
        source=path,
        weight_files=tuple(files),
    )
