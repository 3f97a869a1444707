"""Tensor parallelism on CPU: what two gloo ranks cost and gain on this machine.

Three measurements (each rank pinned to one torch thread, as the ``mp`` executor does on 2 cores):
1. ``comm``: one all-reduce of ``[T, hidden]`` float32 (the per-block reduction) and one all-gather of a
   rank's logits slice ``[T, vocab / 2]``, between two processes over loopback, median of many.
2. ``forward``: the default model's forward + logits, TP=1 (1 and 2 threads) vs TP=2, for a decode batch
   and a prefill chunk, with the time the TP=2 ranks spent inside collectives (61 all-reduces and one
   all-gather per forward for 30 layers).
3. ``engine``: end-to-end greedy generation, ``uni`` TP=1 vs ``mp`` TP=1 vs ``mp`` TP=2 (async on).

    python benchmarks/bench_tp.py                       # all three, prints a table, writes JSON
    python benchmarks/bench_tp.py --only comm forward    # a subset

Expect no speed-up on a 2-core CPU: the point of TP here is correctness; this shows the overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HIDDEN, VOCAB = 576, 49152


# -- child processes (one per rank) ------------------------------------------------------------------
def _join(directory: str, rank: int, world: int):  # type: ignore[no-untyped-def]
    import torch

    from tandem.distributed.process_group import DistInit, connect, file_init_method

    torch.set_num_threads(1)
    return connect(DistInit(world, file_init_method(directory)), rank, torch.device("cpu"))


def child_comm(directory: str, rank: int, world: int, iters: int) -> dict[str, float]:
    import torch

    comm = _join(directory, rank, world)
    out: dict[str, float] = {}
    for rows in (1, 16, 64, 256, 1024):
        t = torch.randn(rows, HIDDEN)
        for _ in range(20):
            comm.all_reduce(t)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            comm.all_reduce(t)
            times.append(time.perf_counter() - t0)
        out[f"all_reduce_{rows}x{HIDDEN}_us"] = statistics.median(times) * 1e6
    for rows in (1, 16):
        t = torch.randn(rows, VOCAB // world)
        times = []
        for _ in range(max(20, iters // 10)):
            t0 = time.perf_counter()
            comm.all_gather(t)
            times.append(time.perf_counter() - t0)
        out[f"all_gather_{rows}x{VOCAB // world}_us"] = statistics.median(times) * 1e6
    return out


def child_forward(
    directory: str, rank: int, world: int, iters: int, threads: int
) -> dict[str, float]:
    import torch

    from tandem.distributed.communicator import SINGLE_RANK
    from tandem.model import CausalLM, KVCache
    from tandem.model.loader import load_checkpoint
    from tandem.model.paged_batch import PagedRequest, build_forward_batch

    comm = _join(directory, rank, world) if world > 1 else SINGLE_RANK
    torch.set_num_threads(threads)
    ckpt = load_checkpoint("smollm2-135m-instruct", torch.float32)
    model = CausalLM.from_tensors(ckpt.args, ckpt.tensors, torch.float32, "cpu", comm=comm)
    args, bs = ckpt.args, 16
    kv = KVCache.allocate(
        args.num_hidden_layers, 256, bs, model.shard.num_kv_heads, args.head_dim, torch.float32, "cpu"
    )
    out: dict[str, float] = {}
    with torch.inference_mode():
        for name, batch_reqs, q, ctx in (("decode_b1", 1, 1, 200), ("decode_b16", 16, 1, 200),
                                         ("prefill_256", 1, 256, 0)):
            reqs = [
                PagedRequest([7] * q, ctx, list(range(i * 16, i * 16 + 16))) for i in range(batch_reqs)
            ]
            batch = build_forward_batch(reqs, bs, last_token_logits_only=True)
            n = iters if q == 1 else max(5, iters // 10)
            stats = comm.stats
            for i in range(n + 3):
                if i == 3:
                    t0 = time.perf_counter()
                    if stats is not None:
                        stats.all_reduce_s = stats.all_gather_s = 0.0
                        stats.all_reduce_calls = stats.all_gather_calls = 0
                h = model(batch, kv).hidden_states
                model.compute_logits(h[batch.logits_indices])
            out[f"{name}_ms"] = (time.perf_counter() - t0) / n * 1e3
            if stats is not None:
                out[f"{name}_comm_ms"] = (stats.all_reduce_s + stats.all_gather_s) / n * 1e3
                out[f"{name}_all_reduce_us"] = stats.all_reduce_s / max(1, stats.all_reduce_calls) * 1e6
                out[f"{name}_all_reduces_per_forward"] = stats.all_reduce_calls / n
    return out


def _run_ranks(kind: str, world: int, *extra: str) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="tandem-bench-tp-") as d:
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--child", kind, d, str(r), str(world), *extra],
                stdout=subprocess.PIPE, text=True,
            )
            for r in range(world)
        ]
        outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{kind} child failed: {[p.returncode for p in procs]}")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


# -- parent ------------------------------------------------------------------------------------------
def bench_comm(iters: int) -> dict[str, float]:
    return _run_ranks("comm", 2, str(iters))[0]


def bench_forward(iters: int) -> dict[str, dict[str, float]]:
    return {
        "tp1_1thread": _run_ranks("forward", 1, str(iters), "1")[0],
        "tp1_2threads": _run_ranks("forward", 1, str(iters), "2")[0],
        "tp2_1thread_each": _run_ranks("forward", 2, str(iters), "1")[0],
    }


def bench_engine(num_prompts: int, max_tokens: int) -> dict[str, dict[str, float]]:
    from tandem import LLM, SamplingParams

    sys.path.insert(0, str(HERE.parent))
    from tests.helpers import humaneval_prompts

    prompts = list(humaneval_prompts(num_prompts))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    results = {}
    for label, kw in (
        ("uni_tp1", {"executor_backend": "uni"}),
        ("mp_tp1", {"executor_backend": "mp"}),
        ("mp_tp2", {"executor_backend": "mp", "tensor_parallel_size": 2}),
    ):
        llm = LLM(max_num_seqs=num_prompts, **kw)
        llm.generate(prompts[:2], params.clone(max_tokens=4), use_tqdm=False)  # warm-up
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        results[label] = {
            "wall_s": wall, "output_tokens": n_out, "output_tok_per_s": n_out / wall,
            "async": llm.async_scheduling.resolved,
        }
        llm.shutdown()
    return results


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, d, rank, world = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        if kind == "comm":
            res = child_comm(d, rank, world, int(sys.argv[6]))
        else:
            res = child_forward(d, rank, world, int(sys.argv[6]), int(sys.argv[7]))
        print(json.dumps(res))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", nargs="*", default=["comm", "forward", "engine"])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=str(HERE / "results" / "tp.json"))
    ns = p.parse_args()
    report: dict[str, object] = {"cpu_count": os.cpu_count(), "command": " ".join(sys.argv)}
    if "comm" in ns.only:
        report["comm"] = bench_comm(ns.iters * 5)
    if "forward" in ns.only:
        report["forward"] = bench_forward(ns.iters // 4)
    if "engine" in ns.only:
        report["engine"] = bench_engine(ns.num_prompts, ns.max_tokens)
    print(json.dumps(report, indent=2))
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
