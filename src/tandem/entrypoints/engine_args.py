"""Engine flags shared by every command (vLLM's names), and their mapping to ``LLM`` keyword arguments."""

from __future__ import annotations

import argparse
from typing import Any

from tandem.config import DEFAULT_MODEL


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=DEFAULT_MODEL, help="model name, .gguf file or HF directory")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    g.add_argument(
        "--quantization", "-q", default=None, choices=["auto", "gguf", "int8", "none"],
        help="gguf: a quantized GGUF file's matrices stay in their blocks; int8: weight-only int8 (any "
        "checkpoint, a scale per output feature); none: dequantize at load; default auto (gguf for a "
        "quantized GGUF file on one CPU rank in float32)",
    )
    g.add_argument(
        "--quant-activations", default=None, choices=["auto", "float32", "int8", "int8x2"],
        help="what gguf products quantize their inputs to: int8x2 (two int8 levels, ~5e-6 relative), int8 "
        "(one, llama.cpp's, lossy) or float32; default auto (int8x2 with AVX-512 VNNI, else float32)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=None)
    g.add_argument("--max-num-batched-tokens", type=int, default=None)
    g.add_argument("--block-size", type=int, default=None)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--kv-cache-memory", type=int, default=None, help="KV cache budget in bytes")
    g.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True
    )
    g.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on / off; default: auto (on when every component supports it)",
    )
    g.add_argument(
        "--deferred-reconciliation",
        action="store_true",
        help="launch step N+1 without waiting for step N's accepted counts (needs async)",
    )
    g.add_argument(
        "--executor-backend",
        "--distributed-executor-backend",
        dest="executor_backend",
        default="uni",
        help="uni (worker thread) | mp (worker processes) | ray (Ray actors)",
    )
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    g.add_argument(
        "--ray-address", default=None,
        help="ray executor: address of an existing cluster; default $RAY_ADDRESS, else a local one",
    )
    g.add_argument("--speculative-config", default=None, help="JSON, vLLM's keys")
    g.add_argument("--chat-template", default=None,
                   help="a Jinja chat template (a file's path, or the template itself) in place of the model's")
    g.add_argument("--worker-threads", type=int, default=None, help="torch threads in the worker")
    g.add_argument("--debug-invariants", action="store_true", help="check invariants every step")


def engine_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    keys = (
        "dtype device seed max_model_len max_num_seqs max_num_batched_tokens block_size "
        "num_kv_blocks kv_cache_memory enable_prefix_caching async_scheduling executor_backend "
        "tensor_parallel_size speculative_config worker_threads deferred_reconciliation ray_address quantization "
        "quant_activations chat_template"
    ).split()
    kw = {k: getattr(ns, k) for k in keys}
    kw["debug_invariants"] = True if ns.debug_invariants else None
    if getattr(ns, "trace", None):
        kw["trace_file"] = ns.trace
    return kw
