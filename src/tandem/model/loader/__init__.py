"""Loading model weights, hyper-parameters and tokenizers from GGUF files and Hugging Face
checkpoint directories, always into Hugging Face tensor names (see ``model_args.py``)."""

from __future__ import annotations

from tandem.model.loader.checkpoint import Checkpoint, load_checkpoint, load_tokenizer
from tandem.model.loader.quants import UnsupportedQuantError
from tandem.model.loader.registry import DEFAULT_MODEL, KNOWN_MODELS, resolve_model
from tandem.model.loader.tokenizer import SpecialTokens, Tokenizer

__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "Checkpoint",
    "SpecialTokens",
    "Tokenizer",
    "UnsupportedQuantError",
    "load_checkpoint",
    "load_tokenizer",
    "resolve_model",
]
