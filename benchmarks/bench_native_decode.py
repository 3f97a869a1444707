"""The native decoder stack A/B: the same short forward steps three ways, interleaved step by step.

Arms (the whole model, SmolLM2-135M-Instruct, every layer, logits of the sampled rows included):
- ``stack``: the default — a short step runs every layer in one native call (model/native_decode.py);
- ``layers``: the torch layers with the same few-row product kernels (``native`` linear kernels);
- ``onednn``: the torch layers with oneDNN products (the previous CPU default).
Steps: ``B x q`` = B requests with q query rows each after ``context`` cached tokens (q = 1: decodes;
q = 4: verify of 3 drafts). One model per arm prefills the same requests into its own cache, then the arms
alternate step by step (so drift in this VM's speed hits all alike); the table reports median ms per step
and the speed-up of ``stack`` over each other arm.

    python benchmarks/bench_native_decode.py --json benchmarks/results/native_decode.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DTYPES, environment  # noqa: E402

from tandem.model import CausalLM, KVCache  # noqa: E402
from tandem.model.loader import DEFAULT_MODEL, load_checkpoint  # noqa: E402
from tandem.model.paged_batch import PagedRequest, build_forward_batch  # noqa: E402

BLOCK_SIZE = 16
ARMS = ("stack", "layers", "onednn")


def build(ckpt, dtype: torch.dtype, arm: str) -> CausalLM:
    model = CausalLM.from_tensors(
        ckpt.args, ckpt.tensors, dtype, "cpu", linear_kernels="onednn" if arm == "onednn" else "native"
    )
    if arm != "stack":
        model._native, model._native_resolved = None, True  # the torch layers
    return model


def steps_for(model: CausalLM, batch: int, q: int, context: int, n: int) -> list[Callable[[], None]]:
    """Prefill ``context`` tokens per request (untimed); return ``n`` steps of ``q`` rows per request.
    Every step writes the same positions again (a verify's rows are rewritten by the next one)."""
    args = model.args
    per_req = -(-(context + q) // BLOCK_SIZE)
    ids = list(range(per_req * batch))
    random.Random(0).shuffle(ids)
    tables = [ids[i * per_req : (i + 1) * per_req] for i in range(batch)]
    a = args
    cache = KVCache.allocate(a.num_hidden_layers, len(ids), BLOCK_SIZE, a.num_key_value_heads, a.head_dim, model.dtype, "cpu")
    rng = random.Random(1)
    prompts = [[rng.randrange(a.vocab_size) for _ in range(context)] for _ in range(batch)]
    model(build_forward_batch([PagedRequest(p, 0, t) for p, t in zip(prompts, tables)], BLOCK_SIZE), cache)

    def step() -> Callable[[], None]:
        reqs = [PagedRequest([rng.randrange(a.vocab_size) for _ in range(q)], context, t) for t in tables]
        b = build_forward_batch(reqs, BLOCK_SIZE)

        def run() -> None:
            model.compute_logits(model(b, cache).hidden_states)

        return run

    return [step() for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--shapes", default="1x1,1x4,4x1,8x1", help="BxQ: requests x query rows each")
    p.add_argument("--contexts", default="128,512")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    torch.set_num_threads(2)
    shapes = [tuple(int(v) for v in s.split("x")) for s in ns.shapes.split(",")]
    contexts = [int(c) for c in ns.contexts.split(",")]
    ckpt = load_checkpoint(DEFAULT_MODEL, torch.float32)
    dtypes = ns.dtypes.split(",")
    bar = tqdm(total=len(dtypes) * len(shapes) * len(contexts) * len(ARMS) * ns.steps, unit="step")
    results = []
    for dname in dtypes:
        models = {arm: build(ckpt, DTYPES[dname], arm) for arm in ARMS}
        for batch, q in shapes:
            for context in contexts:
                bar.set_postfix_str(f"{dname} {batch}x{q} context {context}")
                steps = {arm: steps_for(m, batch, q, context, ns.steps + 2) for arm, m in models.items()}
                times: dict[str, list[float]] = {arm: [] for arm in ARMS}
                with torch.inference_mode():
                    for i in range(ns.steps + 2):
                        for arm in ARMS:
                            t0 = time.perf_counter()
                            steps[arm][i]()
                            if i >= 2:  # warm-up
                                times[arm].append(time.perf_counter() - t0)
                                bar.update(1)
                row = {"dtype": dname, "shape": f"{batch}x{q}", "context": context}
                for arm in ARMS:
                    row[f"{arm}_ms"] = statistics.median(times[arm]) * 1e3
                for arm in ARMS[1:]:
                    row[f"stack_vs_{arm}"] = row[f"{arm}_ms"] / row["stack_ms"]
                results.append(row)
    bar.close()
    head = ["dtype", "shape", "context", *(f"{a} ms" for a in ARMS), "vs layers", "vs onednn"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in results:
        cells = [r["dtype"], r["shape"], str(r["context"]), *(f"{r[f'{a}_ms']:.1f}" for a in ARMS)]
        cells += [f"{r['stack_vs_layers']:.2f}x", f"{r['stack_vs_onednn']:.2f}x"]
        print("| " + " | ".join(cells) + " |")
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"environment": environment(), "args": vars(ns), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
