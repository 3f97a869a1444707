"""The model: architecture arguments, the flat forward batch, paged attention and the transformer."""

from __future__ import annotations

from tandem.model.forward_batch import ForwardBatch, KVCache
from tandem.model.model_args import ModelArgs
from tandem.model.transformer import CausalLM, ModelOutput

__all__ = ["CausalLM", "ForwardBatch", "KVCache", "ModelArgs", "ModelOutput"]
