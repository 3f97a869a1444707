"""Attention backends A/B: the same forward-only decode steps with each backend, interleaved step by step.

The whole model runs (SmolLM2-135M-Instruct, every layer), so the numbers are what a decode step costs
with each backend, not the attention alone. For every dtype, batch size and context length, one model per
backend prefills the same requests into its own cache, then the arms alternate step by step (so drift in
this VM's speed hits all alike); the table reports median ms per step and each backend's speed-up over
the last one named (the reference, ``sdpa`` by default).

    python benchmarks/bench_attention.py --json benchmarks/results/attention.json
    python benchmarks/bench_attention.py --dtypes bf16 --batches 32 --contexts 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_forward import _tandem_steps  # noqa: E402
from common import DTYPES, environment  # noqa: E402

from tandem.model import CausalLM  # noqa: E402
from tandem.model.loader import DEFAULT_MODEL, load_checkpoint  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default="paged_cpu,sdpa", help="comma list; the last is the reference")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--batches", default="1,4,16,32")
    p.add_argument("--contexts", default="128,512", help="tokens cached before decoding")
    p.add_argument("--steps", type=int, default=24, help="decode steps timed per arm")
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    torch.set_num_threads(2)
    backends = ns.backends.split(",")
    dtypes = ns.dtypes.split(",")
    batches = [int(b) for b in ns.batches.split(",")]
    contexts = [int(c) for c in ns.contexts.split(",")]
    ckpt = load_checkpoint(DEFAULT_MODEL, torch.float32)
    cells = len(dtypes) * len(batches) * len(contexts)
    bar = tqdm(total=cells * len(backends) * ns.steps, desc="bench_attention", unit="step")
    results = []
    for dname in dtypes:
        models = {
            b: CausalLM.from_tensors(ckpt.args, ckpt.tensors, DTYPES[dname], "cpu", b) for b in backends
        }
        for batch in batches:
            for context in contexts:
                bar.set_postfix_str(f"{dname} batch {batch} context {context}")
                steps = {b: _tandem_steps(m, batch, context, ns.steps + 2) for b, m in models.items()}
                times: dict[str, list[float]] = {b: [] for b in backends}
                with torch.inference_mode():
                    for i in range(ns.steps + 2):
                        for b in backends:
                            t0 = time.perf_counter()
                            steps[b][i]()
                            if i >= 2:  # the first two steps are warm-up
                                times[b].append(time.perf_counter() - t0)
                                bar.update(1)
                row = {"dtype": dname, "batch": batch, "context": context}
                for b in backends:
                    row[f"{b}_ms"] = statistics.median(times[b]) * 1e3
                ref = row[f"{backends[-1]}_ms"]
                for b in backends[:-1]:
                    row[f"{b}_speedup"] = ref / row[f"{b}_ms"]
                results.append(row)
    bar.close()
    head = ["dtype", "batch", "context"] + [f"{b} ms/step" for b in backends]
    head += [f"{b} speed-up" for b in backends[:-1]]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in results:
        cells_ = [r["dtype"], str(r["batch"]), str(r["context"])]
        cells_ += [f"{r[f'{b}_ms']:.1f}" for b in backends]
        cells_ += [f"**{r[f'{b}_speedup']:.2f}×**" for b in backends[:-1]]
        print("| " + " | ".join(cells_) + " |")
    if ns.json:
        Path(ns.json).write_text(
            json.dumps({"environment": environment(), "args": vars(ns), "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
