"""Linear-kernel formulations side by side: tandem's forward (decode steps, logits of the last rows) with
each registered set of matrix products (``model/linear.py``), same weights, interleaved step by step.

Rows per step = the batch: 1 (single stream), 4 (a k = 3 verify of one request), 16 and 32 (decode
batches). The table reports median ms per step and each set's speed-up over ``cpu`` (the previous default).

    python benchmarks/bench_linear.py --json benchmarks/results/linear.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_forward import DTYPES, _tandem_steps, _timed  # noqa: E402
from common import environment  # noqa: E402

from tandem.model import CausalLM  # noqa: E402
from tandem.model.linear import LINEAR_KERNELS  # noqa: E402
from tandem.model.loader import DEFAULT_MODEL, load_checkpoint  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--batches", default="1,4,16,32")
    p.add_argument("--kernels", default="cpu,onednn", help=f"comma list of {sorted(LINEAR_KERNELS)}")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    torch.set_num_threads(ns.threads)
    kernels = ns.kernels.split(",")
    dtypes, batches = ns.dtypes.split(","), [int(b) for b in ns.batches.split(",")]
    ckpt = load_checkpoint(DEFAULT_MODEL, torch.float32)
    load_before = os.getloadavg()[0]
    rows = []
    total = len(dtypes) * len(batches) * ns.rounds * ns.steps * len(kernels)
    with tqdm(total=total, desc="decode steps", unit="step", file=sys.stderr) as bar:
        for name in dtypes:
            models = {
                k: CausalLM.from_tensors(ckpt.args, ckpt.tensors, DTYPES[name], linear_kernels=k)
                for k in kernels
            }
            for batch in batches:
                bar.set_postfix_str(f"{name} batch {batch}")
                times: dict[str, list[float]] = {k: [] for k in kernels}
                for _ in range(ns.rounds):
                    steps = {k: _tandem_steps(m, batch, ns.context, ns.steps) for k, m in models.items()}
                    for i in range(ns.steps):
                        for k in kernels:  # interleaved: load drift hits every set alike
                            times[k].append(_timed(steps[k][i]))
                            bar.update(1)
                med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                rows.append({"dtype": name, "batch": batch, "median_ms": med,
                             "speedup_vs_cpu": {k: med.get("cpu", med[k]) / med[k] for k in kernels}})
            del models
    print(f"\ntandem forward + logits, context {ns.context}, {ns.threads} threads, "
          f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}; median ms/step")
    print("dtype  rows  " + "  ".join(f"{k:>8}" for k in kernels) + "  " +
          "  ".join(f"{k}/cpu" for k in kernels if k != "cpu"))
    for r in rows:
        cells = "  ".join(f"{r['median_ms'][k]:8.1f}" for k in kernels)
        ratios = "  ".join(f"{r['speedup_vs_cpu'][k]:8.2f}x" for k in kernels if k != "cpu")
        print(f"{r['dtype']:>5}  {r['batch']:>4}  {cells}  {ratios}")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"environment": environment(), "context": ns.context,
                                             "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
