"""Build a model runner from plain, picklable data: used in-process (``uni``) and in worker processes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.config import EngineConfig
from tandem.model.forward_batch import KVCache
from tandem.model.loader import Checkpoint, load_checkpoint
from tandem.model.transformer import CausalLM
from tandem.spec_decode.factory import build_proposer
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.model_runner import ModelRunner

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its runner; crosses process boundaries by pickle."""

    config: EngineConfig
    async_scheduling: bool
    num_kv_blocks: int
    max_model_len: int
    eos_token_ids: frozenset[int]
    trace: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.config.model.resolved_dtype()]


def build_runner(
    spec: WorkerSpec, checkpoint: Checkpoint | None = None, tracer: Tracer = NULL_TRACER
) -> ModelRunner:
    cfg = spec.config
    device = torch.device(cfg.model.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    ckpt = checkpoint or load_checkpoint(cfg.model.model, spec.dtype)
    model = CausalLM.from_tensors(ckpt.args, ckpt.tensors, spec.dtype, device)
    args = ckpt.args
    kv = KVCache.allocate(
        args.num_hidden_layers,
        spec.num_kv_blocks,
        cfg.cache.block_size,
        args.num_key_value_heads,
        args.head_dim,
        spec.dtype,
        device,
    )
    proposer = None
    if cfg.speculative is not None:
        proposer = build_proposer(
            cfg.speculative, target=model, target_checkpoint=ckpt, num_kv_blocks=spec.num_kv_blocks,
            block_size=cfg.cache.block_size, max_model_len=spec.max_model_len,
        )
    return ModelRunner(
        model,
        kv,
        max_model_len=spec.max_model_len,
        max_num_seqs=cfg.scheduler.max_num_seqs,
        eos_token_ids=spec.eos_token_ids,
        async_scheduling=spec.async_scheduling,
        deferred_reconciliation=cfg.scheduler.deferred_reconciliation,
        proposer=proposer,
        num_spec_tokens=cfg.speculative.num_speculative_tokens if cfg.speculative else 0,
        tracer=tracer,
    )
