"""The sampler's exponential noise: torch's ``exponential_`` against the same numbers drawn as float64 uniforms
and transformed vectorized (``tandem.sample.rng``), alone and in whole decodes.

``--mode draw``: the draw of ``[rows, V]`` noise (V = the default model's 49,152), one seeded generator a row
(every row its own, as for seeded requests) and one batched unseeded draw, best of ``--repeats``.
``--mode decode``: no speculation, temperature 0.7, HumanEval prompts x 64 tokens at ``--concurrency``
streams, each arm (``torch``: the old draw patched back in; ``tandem``: as shipped) an engine in its own process,
arms alternating, ``--repeats`` times each. Both check that the two draws give the same bits.

    python benchmarks/bench_sampling_noise.py --json benchmarks/results/sampling_noise.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import environment  # noqa: E402

VOCAB = 49_152


def draw(rows: int, repeats: int) -> dict[str, float]:
    import torch

    from tandem.sample.rng import exponential_noise, make_generator

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3

    cpu = torch.device("cpu")
    gens = lambda: [make_generator(1000 + i, "cpu") for i in range(rows)]  # noqa: E731
    a = exponential_noise(rows, VOCAB, gens(), cpu)
    b = torch.stack([torch.empty(VOCAB).exponential_(generator=g) for g in gens()]).clamp_min_(1.1754944e-38)
    assert torch.equal(a, b), "the two draws differ"
    out = {
        "seeded_torch_ms": best(lambda: [torch.empty(VOCAB).exponential_(generator=g) for g in gens()]),
        "seeded_tandem_ms": best(lambda: exponential_noise(rows, VOCAB, gens(), cpu)),
        "unseeded_torch_ms": best(lambda: torch.empty(rows, VOCAB).exponential_()),
        "unseeded_tandem_ms": best(lambda: exponential_noise(rows, VOCAB, [None] * rows, cpu)),
    }
    return out


def decode_worker(arm: str, concurrency: int) -> None:
    import tandem.sample.rng as rng

    if arm == "torch":
        rng._exponential_ = lambda t, g: t.exponential_(generator=g)
    from tandem import LLM, SamplingParams
    from tandem.bench.workloads import humaneval_requests

    prompts = [r.prompt for r in humaneval_requests(concurrency, 64, 0)]
    llm = LLM(max_num_seqs=max(concurrency, 1))
    params = SamplingParams(temperature=0.7, max_tokens=64, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(json.dumps({"tok_s": tokens / (time.perf_counter() - t0)}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["draw", "decode", "both"], default="both")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, help="a PNG of the decode arms' tok/s")
    p.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.worker:
        decode_worker(ns.worker[0], int(ns.worker[1]))
        return 0
    result: dict = {"environment": environment(), "draw": {}, "decode": {}}
    if ns.mode in ("draw", "both"):
        for rows in ns.rows:
            r = result["draw"][rows] = draw(rows, ns.repeats)
            print(f"draw {rows} rows: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
    if ns.mode in ("decode", "both"):
        for c in ns.concurrency:
            runs: dict[str, list[float]] = {"torch": [], "tandem": []}
            for rep in range(ns.repeats):
                for arm in (("torch", "tandem") if rep % 2 == 0 else ("tandem", "torch")):
                    out = subprocess.run([sys.executable, __file__, "--worker", arm, str(c)], check=True,
                                         capture_output=True, text=True).stdout
                    runs[arm].append(json.loads(out.strip().splitlines()[-1])["tok_s"])
                    print(f"decode c={c} {arm}: {runs[arm][-1]:.1f} tok/s", flush=True)
            result["decode"][c] = {arm: {"runs": v, "mean": sum(v) / len(v)} for arm, v in runs.items()}
            print(f"decode c={c}: tandem / torch = "
                  f"{result['decode'][c]['tandem']['mean'] / result['decode'][c]['torch']['mean']:.2f}x", flush=True)
    result["environment"]["load_average_end"] = list(__import__("os").getloadavg())
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1))
    if ns.plot and result["decode"]:
        plot(result["decode"], ns.plot)
    return 0


def plot(decode: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = sorted(decode)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, arm in enumerate(("torch", "tandem")):
        ax.bar([j + 0.4 * i for j in range(len(cs))], [decode[c][arm]["mean"] for c in cs], width=0.4,
               label={"torch": "torch exponential_", "tandem": "float64 uniforms, vectorized"}[arm])
    ax.set_xticks([j + 0.2 for j in range(len(cs))], [f"{c} streams" for c in cs])
    ax.set_ylabel("output tok/s (T 0.7, no speculation)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
