"""Build a model runner from plain, picklable data: used in-process (``uni``) and in worker processes."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from tandem.config import EngineConfig
from tandem.distributed.process_group import DistInit, connect
from tandem.execution import ExecutionPlan, resolve_execution
from tandem.model.forward_batch import KVCache
from tandem.model.loader import Checkpoint, load_checkpoint, load_tokenizer
from tandem.model.transformer import CausalLM
from tandem.spec_decode.factory import build_proposer
from tandem.structured.manager import StructuredOutputManager
from tandem.worker.pooler import Pooler
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
    # Tensor parallelism: this worker's rank, how it joins its group (None: one rank) and its device
    # (None: the model config's).
    tp_rank: int = 0
    dist: DistInit | None = None
    device: str | None = None
    quantized: bool = False  # the resolved quantization is "gguf": matrices stay in their GGUF blocks
    quant_activations: str = "float32"  # their products' inputs (the resolved quant_activations)
    int8_weights: bool = False  # the resolved quantization is "int8": layer matrices int8 at load
    # What computes a step (tandem/execution.py), resolved by the engine; None: resolved here (tests).
    execution: ExecutionPlan | None = None

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.config.model.resolved_dtype()]


def build_runner(
    spec: WorkerSpec, checkpoint: Checkpoint | None = None, tracer: Tracer = NULL_TRACER
) -> ModelRunner:
    cfg = spec.config
    device = torch.device(spec.device or cfg.model.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    comm = connect(spec.dist, spec.tp_rank, device)  # blocks until every rank has joined
    # (mp and Ray workers first made their native libraries the plan's: ExecutionPlan.apply_process_wide)
    execution = spec.execution or resolve_execution(device)
    ckpt = checkpoint or load_checkpoint(cfg.model.model, spec.dtype, keep_quantized=spec.quantized)
    model = CausalLM.from_tensors(ckpt.args, ckpt.tensors, spec.dtype, device, comm=comm,
                                  quant_activations=spec.quant_activations, int8_weights=spec.int8_weights,
                                  attn_backend=execution.attention_backend,
                                  linear_kernels=execution.linear_kernels,
                                  native_decode=execution.native_decode)
    args = ckpt.args
    kv = KVCache.allocate(
        args.num_hidden_layers,
        spec.num_kv_blocks,
        cfg.cache.block_size,
        model.shard.num_kv_heads,  # this rank's KV heads
        args.head_dim,
        spec.dtype,
        device,
        layer_tensor=model.layer_tensor,  # KV cache groups share tensors (core/kv_cache_manager.py)
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
        tree=cfg.speculative.tree if cfg.speculative else None,
        tracer=tracer,
        # Grammars and bad words need the tokenizer on the worker; it is loaded on first use.
        structured=StructuredOutputManager(
            functools.partial(load_tokenizer, cfg.model.tokenizer_source), args.vocab_size, spec.eos_token_ids
        ),
        pooler=Pooler(cfg.model.pooling_type, cfg.model.pooling_normalize) if cfg.model.pooling else None,
    )
