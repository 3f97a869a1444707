"""The fixed contract of an A/B run (docs/SEMANTICS.md §6), recorded in full with the results."""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import tandem
from tandem.bench.workloads import BenchRequest


def _git_commit() -> str:
    try:
        root = Path(tandem.__file__).resolve().parents[2]
        return subprocess.check_output(
            ["git", "-C", str(root), "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL
        ).strip()
    except Exception:
        return "unknown"


def file_sha256(path: Path) -> str:
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _dist(values: list[int]) -> dict[str, float]:
    return {
        "min": min(values),
        "mean": statistics.mean(values),
        "median": statistics.median(values),
        "max": max(values),
    }


def build_contract(
    ns: argparse.Namespace, llm: Any, requests: list[BenchRequest], params: Any
) -> dict[str, Any]:
    import torch

    from tandem.model.loader import resolve_model

    tok = llm.tokenizer
    lengths = [len(r.prompt) if isinstance(r.prompt, list) else len(tok.encode(r.prompt))
               for r in requests]
    model_path = resolve_model(ns.model)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cfg = llm.config
    return {
        "model": ns.model,
        "model_file": str(model_path),
        "model_sha256": file_sha256(model_path),
        "tandem_version": tandem.__version__,
        "git_commit": _git_commit(),
        "dtype": cfg.model.resolved_dtype(),
        "device": cfg.model.device,
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "torch": torch.__version__,
        "executor_backend": cfg.parallel.executor_backend,
        "workload": {
            "dataset": ns.dataset_name,
            "num_requests": len(requests),
            "input_len": _dist(lengths),
            "output_len": _dist([r.output_len for r in requests]),
            "max_concurrency": ns.max_concurrency,
            "request_rate": ns.request_rate,
            "seed": ns.seed,
            "ignore_eos": ns.ignore_eos,
        },
        "speculation": None if cfg.speculative is None else asdict(cfg.speculative),
        "sampling": {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
        },
        "repeats": ns.repeats,
        "arms": list(ns.arms),
    }
