"""vLLM's ``vllm.benchmarks.datasets`` entry points that example scripts use: ``add_dataset_parser`` and
``get_samples``, over datasets available offline — ``random`` (vLLM's: random token ids, decoded),
``custom`` (vLLM's: a JSONL file of ``{"prompt": ...}`` lines), and tandem's ``humaneval`` and ``repetition``
(tandem.bench.workloads)."""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from typing import Any

from tandem.bench import workloads

DATASET_NAMES = ("random", "custom", "humaneval", "repetition")


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int
    expected_output_len: int
    multi_modal_data: Any = None
    request_id: str = ""


def add_dataset_parser(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("dataset")
    g.add_argument("--dataset-name", default="random", choices=DATASET_NAMES, help="default random")
    g.add_argument("--dataset-path", default=None, help="custom: a JSONL file with a 'prompt' per line")
    g.add_argument("--num-prompts", type=int, default=1000, help="default 1000")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--random-input-len", type=int, default=1024, help="random: prompt tokens; default 1024")
    g.add_argument("--random-output-len", type=int, default=128, help="random: output tokens; default 128")
    g.add_argument("--custom-output-len", type=int, default=256, help="custom and tandem's: default 256")


def get_samples(args: argparse.Namespace, tokenizer: Any) -> list[SampleRequest]:
    """``args.num_prompts`` samples of ``args.dataset_name``; ``tokenizer`` (an HF or tandem tokenizer)
    measures the prompts and decodes the random ones."""
    n, name = args.num_prompts, args.dataset_name
    if n < 1:
        raise ValueError(f"num_prompts must be at least 1, got {n}")
    if name == "random":
        rng = random.Random(args.seed)
        vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size
        texts = [tokenizer.decode([rng.randrange(100, vocab) for _ in range(args.random_input_len)])
                 for _ in range(n)]
        out_len = args.random_output_len
    elif name == "custom":
        if not args.dataset_path:
            raise ValueError("dataset_name 'custom' needs --dataset-path (a JSONL file of {\"prompt\": ...})")
        with open(args.dataset_path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        texts = [str(r["prompt"]) for r in rows][:n]
        out_len = args.custom_output_len
    else:
        make = workloads.humaneval_requests if name == "humaneval" else workloads.repetition_requests
        texts = [str(r.prompt) for r in make(n, args.custom_output_len, args.seed)]
        out_len = args.custom_output_len
    return [SampleRequest(t, len(tokenizer.encode(t)), out_len, None, str(i)) for i, t in enumerate(texts)]
