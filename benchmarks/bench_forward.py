"""Forward-only decode speed: tandem's paged transformer beside transformers, in the same run.

For each dtype and batch size, both models first prefill ``--context`` tokens per request, then run
``--steps`` decode steps (one new token per request; the context grows by one each step). Timed per step:
the model forward plus logits of the last rows (tandem: ``forward`` + ``compute_logits``; transformers:
``forward(use_cache=True, logits_to_keep=1)`` on a DynamicCache). Batch construction, sampling and
tokenisation are outside the timed region. Rounds interleave tandem and transformers step by step so load on a
shared machine hits both alike; the table reports the median step and the 10th percentile.

    python benchmarks/bench_forward.py                       # fp32 + bf16, batch 1 and 16
    python benchmarks/bench_forward.py --dtypes fp32 --batches 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from tqdm import tqdm

from tandem.model import CausalLM, ForwardBatch, KVCache
from tandem.model.loader import DEFAULT_MODEL, load_checkpoint
from tandem.model.paged_batch import PagedRequest, build_forward_batch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BLOCK_SIZE = 16


@dataclass
class Result:
    dtype: str
    batch: int
    engine: str
    median_ms_per_step: float
    p10_ms_per_step: float
    ms_per_token: float
    steps_timed: int


Step = Callable[[], None]


def _tandem_steps(model: CausalLM, batch: int, context: int, steps: int) -> list[Step]:
    """Prefill ``context`` tokens per request (untimed); return the ``steps`` decode steps to time."""
    args = model.args
    blocks_per_req = -(-(context + steps) // BLOCK_SIZE)
    ids = list(range(blocks_per_req * batch))
    random.Random(0).shuffle(ids)  # scattered blocks, as a real pool hands them out
    tables = [ids[i * blocks_per_req : (i + 1) * blocks_per_req] for i in range(batch)]
    cache = KVCache.allocate(
        args.num_hidden_layers,
        len(ids),
        BLOCK_SIZE,
        args.num_key_value_heads,
        args.head_dim,
        model.dtype,
        model.device,
    )
    rng = random.Random(1)
    prompt = [[rng.randrange(args.vocab_size) for _ in range(context)] for _ in range(batch)]
    model(
        build_forward_batch([PagedRequest(p, 0, t) for p, t in zip(prompt, tables)], BLOCK_SIZE),
        cache,
    )

    def step(b: ForwardBatch) -> Step:
        def run() -> None:
            out = model(b, cache)
            assert b.logits_indices is not None
            model.compute_logits(out.hidden_states[b.logits_indices])

        return run

    return [
        step(
            build_forward_batch(
                [PagedRequest([rng.randrange(args.vocab_size)], context + s, t) for t in tables],
                BLOCK_SIZE,
                model.device,
                last_token_logits_only=True,
            )
        )
        for s in range(steps)
    ]


def _hf_steps(hf: Any, batch: int, context: int, steps: int, vocab: int) -> list[Step]:
    """The same for transformers, on its DynamicCache."""
    rng = random.Random(1)
    prompt = torch.tensor([[rng.randrange(vocab) for _ in range(context)] for _ in range(batch)])
    with torch.inference_mode():
        state = {"cache": hf(prompt, use_cache=True, logits_to_keep=1).past_key_values}

    def step(tok: torch.Tensor) -> Step:
        def run() -> None:
            with torch.inference_mode():
                out = hf(tok, past_key_values=state["cache"], use_cache=True, logits_to_keep=1)
                out.logits.float()
                state["cache"] = out.past_key_values

        return run

    return [
        step(torch.tensor([[rng.randrange(vocab)] for _ in range(batch)])) for _ in range(steps)
    ]


def _timed(step: Step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def _step_cell(r: Result) -> str:
    return f"{r.median_ms_per_step:.1f} ({r.p10_ms_per_step:.1f})"


def _summary(dtype: str, batch: int, engine: str, times: list[float]) -> Result:
    ms = sorted(t * 1e3 for t in times)
    median = statistics.median(ms)
    return Result(dtype, batch, engine, median, ms[len(ms) // 10], median / batch, len(ms))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16")
    p.add_argument("--batches", default="1,16", help="comma list of batch sizes")
    p.add_argument("--context", type=int, default=128, help="tokens cached before decoding")
    p.add_argument("--steps", type=int, default=16, help="decode steps per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per engine")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--attn-backend", default=None, help="attention backend (default: the default one)")
    p.add_argument("--no-hf", action="store_true", help="skip transformers")
    p.add_argument(
        "--json", nargs="?", const="-", help="write results as JSON (to a file or stdout)"
    )
    opts = p.parse_args(argv)
    torch.set_num_threads(opts.threads)
    # fp32 first: the transformers model is converted to bf16 in place after it.
    dtypes = sorted({d.strip() for d in opts.dtypes.split(",")}, key=list(DTYPES).index)
    batches = [int(b) for b in opts.batches.split(",")]
    load_before = os.getloadavg()[0]

    ckpt = load_checkpoint(opts.model, torch.float32)
    hf32 = None
    if not opts.no_hf:
        import transformers

        hf32 = transformers.AutoModelForCausalLM.from_pretrained(
            str(ckpt.source.parent), gguf_file=ckpt.source.name, dtype=torch.float32
        ).eval()
    engines = 1 if opts.no_hf else 2
    total = len(dtypes) * len(batches) * engines * opts.rounds * opts.steps
    results: list[Result] = []
    with tqdm(total=total, desc="decode steps", unit="step", file=sys.stderr) as bar:
        for name in dtypes:
            dtype = DTYPES[name]
            model = CausalLM.from_tensors(ckpt.args, ckpt.tensors, dtype, "cpu", opts.attn_backend)
            hf = None if hf32 is None else hf32.to(dtype)
            for batch in batches:
                bar.set_postfix_str(f"{name} batch {batch}")
                tandem_t: list[float] = []
                hf_t: list[float] = []
                for _ in range(opts.rounds):
                    ours = _tandem_steps(model, batch, opts.context, opts.steps)
                    theirs = (
                        _hf_steps(hf, batch, opts.context, opts.steps, ckpt.args.vocab_size)
                        if hf is not None
                        else []
                    )
                    # Interleave step by step so drift in machine load hits both engines alike.
                    for i, step in enumerate(ours):
                        tandem_t.append(_timed(step))
                        if theirs:
                            hf_t.append(_timed(theirs[i]))
                        bar.update(engines)
                results.append(_summary(name, batch, "tandem", tandem_t))
                if hf is not None:
                    results.append(_summary(name, batch, "transformers", hf_t))
    load_after = os.getloadavg()[0]

    print(
        f"\nforward-only decode, context {opts.context}+{opts.steps}, {opts.threads} threads, "
        f"load average {load_before:.1f} -> {load_after:.1f}"
    )
    print("median step (p10 step) in ms; ms/token = median step / batch; speedup of medians")
    header = ["dtype", "batch", "tandem ms/step", "ms/token", "hf ms/step", "ms/token", "speedup"]
    rows = [header]
    by_key = {(r.dtype, r.batch, r.engine): r for r in results}
    for name in dtypes:
        for batch in batches:
            t = by_key[(name, batch, "tandem")]
            h = by_key.get((name, batch, "transformers"))
            row = [name, str(batch), _step_cell(t), f"{t.ms_per_token:.2f}"]
            if h is None:
                row += ["-", "-", "-"]
            else:
                speedup = h.median_ms_per_step / t.median_ms_per_step
                row += [_step_cell(h), f"{h.ms_per_token:.2f}", f"{speedup:.2f}x"]
            rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    if opts.json:
        payload = {
            "model": opts.model,
            "context": opts.context,
            "steps": opts.steps,
            "rounds": opts.rounds,
            "threads": opts.threads,
            "load_average": [load_before, load_after],
            "torch": torch.__version__,
            "results": [asdict(r) for r in results],
        }
        text = json.dumps(payload, indent=2)
        if opts.json == "-":
            print(text)
        else:
            with open(opts.json, "w") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
