"""Quantized execution on the CPU (``quantization="gguf"``) against llama.cpp on the same GGUF file.

  python benchmarks/bench_quant.py --mode speed --prompts 6 --json benchmarks/results/quant_speed.json
  python benchmarks/bench_quant.py --mode accuracy --prompts 16 --json benchmarks/results/quant_accuracy.json

The llama.cpp peer runs in its own venv (``benchmarks/peers/setup_llamacpp.sh``, then ``--llamacpp-python
.venv-llamacpp/bin/python``) as a subprocess (benchmarks/peers/llamacpp_worker.py) that stays idle while
tandem runs and the other way round. Both engines get the same token ids (tandem's tokenizer), decode
greedily for ``--max-tokens`` tokens without stopping, with 2 threads.

speed: every arm loaded at once, each in its own process (TandemArm says why), arms taking turns prompt by
  prompt (the order rotating): tandem fp32 (the file dequantized, ``quantization="none"``), tandem gguf with
  each of ``--activations`` (``quant_activations``), the first of them + each of ``--spec`` (shipped heads,
  k = 3), llama.cpp single stream; then the same prompts 16 at a time (tandem gguf, ``max_num_seqs=16``, the
  first two activations, against llama.cpp's C API batch of 16 sequences), and a prefill of a 512-token
  prompt (tandem fp32 vs gguf). Decode tok/s = tokens after the first / time from the first to the last
  token; weight bytes streamed per second = resident weight bytes x decode steps per second, against the
  machine's read bandwidth measured here (a 1 GiB buffer summed by 2 threads).
accuracy: ``--prompts`` HumanEval prompts, each with the fp32 model's own greedy continuation of
  ``--max-tokens`` tokens, teacher-forced one decode step at a time through tandem gguf and tandem fp32 (the
  native decode stack of both; gguf with each of ``--activations``), and through llama.cpp (all positions' logits in one batch): top-1 agreement
  and mean KL(p_fp32 || p_quantized) over the continuation's positions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, humaneval

from tandem import LLM, SamplingParams
from tandem.model import CausalLM, KVCache
from tandem.model.loader import load_checkpoint, load_tokenizer, resolve_model
from tandem.model.paged_batch import PagedRequest, build_forward_batch

MODEL = "smollm2-135m-instruct"


class Worker:
    """A benchmark engine in its own process, spoken to in JSON lines (one answer per command)."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args} exited")
        return json.loads(line)

    def ask(self, **msg: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")  # the worker exits without an answer
            self.proc.stdin.flush()
        self.proc.wait(timeout=30)


class LlamaCpp(Worker):
    """The peer (benchmarks/peers/llamacpp_worker.py in the peer's venv)."""

    def __init__(self, python: str, path: Path, n_seq: int) -> None:
        worker = Path(__file__).resolve().parent / "peers" / "llamacpp_worker.py"
        super().__init__([python, str(worker), "--model", str(path), "--n-seq", str(n_seq), "--n-ctx", str(4096 * 4)])


class TandemArm(Worker):
    """One tandem engine in its own process (``--arm-worker``), driven like the llama.cpp peer.

    Why a process per arm: two engines in one process share one OpenMP runtime, and with more OpenMP
    threads than cores libgomp stops spinning between parallel regions (its throttled spin count), so every
    one of a decode step's ~150 parallel regions pays a futex wake-up: measured here, loading a second
    (idle) engine beside one took its single-stream decode from ~140 to ~45 tok/s. Separate processes keep
    each engine's runtime to itself, as separate llama.cpp and tandem processes are."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__([sys.executable, __file__, "--arm-worker", json.dumps(kwargs)])


def read_bandwidth() -> float:
    """GB/s of summing a 1 GiB float32 buffer with torch's threads (best of 5)."""
    buf = torch.ones(1 << 28)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        float(buf.sum())
        best = max(best, buf.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return best


def spec(method: str) -> dict[str, Any] | None:
    return None if method == "none" else {"method": method, "num_speculative_tokens": 3}


def arm_worker(kwargs: dict[str, Any], model: str = MODEL) -> None:
    """JSON lines on stdin/stdout: generate (as the llama.cpp worker: greedy, ignore_eos), prefill, stats."""
    torch.set_num_threads(2)
    model = kwargs.pop("model", model)
    llm = LLM(model, **kwargs)
    llm.generate("def f(x):", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    plan = llm.engine_plan
    print(json.dumps({"weight_bytes": plan.weight_bytes, "quantization": plan.quantization.as_dict()}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            break
        if msg["cmd"] == "generate":
            params = SamplingParams(temperature=0, max_tokens=msg["max_tokens"], ignore_eos=True)
            outs = llm.generate([{"prompt_token_ids": p} for p in msg["prompts"]], params, use_tqdm=False)
            first = min(o.metrics.first_token_time for o in outs)
            last = max(o.metrics.last_token_time for o in outs)
            ans = {"tokens": [list(o.outputs[0].token_ids) for o in outs], "decode_s": last - first,
                   "decode_tokens": sum(o.metrics.num_generation_tokens - 1 for o in outs)}
        elif msg["cmd"] == "prefill":
            t0 = time.perf_counter()
            llm.generate({"prompt_token_ids": msg["ids"]}, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
            ans = {"prefill_s": time.perf_counter() - t0}
        else:
            ans = {"stats": llm.spec_decode_stats()}
        print(json.dumps(ans), flush=True)
    llm.shutdown()


def run_speed(ns: argparse.Namespace) -> dict[str, Any]:
    path = resolve_model(MODEL)
    prompts = humaneval(ns.prompts)
    base = {"max_num_seqs": 1, "max_model_len": 2048, "num_kv_blocks": 160, "async_scheduling": False}
    arms: dict[str, dict[str, Any]] = {"tandem fp32": {"quantization": "none"}}
    for a in ns.activations:
        arms[f"tandem gguf {a}"] = {"quantization": "gguf", "quant_activations": a}
    main_arm = f"tandem gguf {ns.activations[0]}"
    for m in ns.spec:
        arms[f"{main_arm} + {m}"] = {"quantization": "gguf", "quant_activations": ns.activations[0],
                                     "speculative_config": spec(m)}
    workers = {n: TandemArm({**base, **kw}) for n, kw in tqdm(arms.items(), desc="load")}
    tok = load_tokenizer(MODEL)
    ids = [tok.encode(p) for p in prompts]
    weight_bytes = {n: w.info["weight_bytes"] for n, w in workers.items()}
    peer = LlamaCpp(ns.llamacpp_python, path, 16) if ns.llamacpp_python else None
    names = [*arms, *(["llama.cpp"] if peer else [])]
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    outputs: dict[str, list[list[int]]] = {n: [] for n in names}
    bar = tqdm(total=len(names) * len(prompts), desc="single stream")
    for i, p in enumerate(ids):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            w = peer if n == "llama.cpp" else workers[n]
            t0 = time.perf_counter()
            r = w.ask(cmd="generate", prompts=[p], max_tokens=ns.max_tokens)  # type: ignore[union-attr]
            rows[n].append({"e2e_s": time.perf_counter() - t0, "decode_s": r["decode_s"],
                            "decode_tokens": r["decode_tokens"]})
            outputs[n].append(r["tokens"][0])
            bar.update(1)
    bar.close()
    stats = {n: workers[n].ask(cmd="stats")["stats"] for n in arms if "+" in n}
    bw = read_bandwidth()
    single = []
    for n in names:
        dec = sum(r["decode_tokens"] for r in rows[n]) / sum(r["decode_s"] for r in rows[n])
        e2e = len(ids) * ns.max_tokens / sum(r["e2e_s"] for r in rows[n])
        res = {"arm": n, "decode_tok_s": dec, "e2e_tok_s": e2e}
        if n in weight_bytes and "+" not in n:
            res["weight_GB_per_s"] = weight_bytes[n] * dec / 1e9
            res["bandwidth_share"] = res["weight_GB_per_s"] / bw
        if n in stats:
            res["mean_acceptance_length"] = stats[n].get("mean_acceptance_length")
        single.append(res)
    ref = next(r for r in single if r["arm"] == "llama.cpp")["decode_tok_s"] if peer else None
    for r in single:
        r["vs_llamacpp"] = r["decode_tok_s"] / ref if ref else None
    same = {n: sum(a == b for a, b in zip(outputs[n], outputs[main_arm])) for n in names}
    for w in workers.values():
        w.close()

    # 16-way aggregate decode: the same prompts, 16 at a time (cycled to 16)
    batch = [ids[i % len(ids)] for i in range(16)]
    wide = {n: TandemArm({"quantization": "gguf", "quant_activations": a, "max_num_seqs": 16, "max_model_len": 2048,
                          "async_scheduling": False})
            for n, a in ((f"tandem gguf {a}", a) for a in ns.activations[:2])}
    agg = []
    order = [*wide, *(["llama.cpp"] if peer else [])]
    for rep in range(ns.repeats):
        k = rep % len(order)
        for n in order[k:] + order[:k]:
            w = peer if n == "llama.cpp" else wide[n]
            t0 = time.perf_counter()
            r = w.ask(cmd="generate", prompts=batch, max_tokens=ns.max_tokens)  # type: ignore[union-attr]
            agg.append({"arm": n, "rep": rep, "e2e_s": time.perf_counter() - t0, "decode_s": r["decode_s"],
                        "decode_tokens": r["decode_tokens"]})
    for w in wide.values():
        w.close()
    batch16 = []
    for n in order:
        rs = [r for r in agg if r["arm"] == n]
        batch16.append({"arm": n, "decode_tok_s": sum(r["decode_tokens"] for r in rs) / sum(r["decode_s"] for r in rs),
                        "e2e_tok_s": len(rs) * 16 * ns.max_tokens / sum(r["e2e_s"] for r in rs)})
    if ref:
        b_ref = next(r for r in batch16 if r["arm"] == "llama.cpp")["decode_tok_s"]
        for r in batch16:
            r["vs_llamacpp"] = r["decode_tok_s"] / b_ref
    if peer:
        peer.close()

    # prefill of a 512-token prompt: fp32 vs gguf (tandem), best of 3 each, interleaved
    long_ids = ([t for p in ids for t in p] * 8)[:512]
    pre_arms = {"tandem fp32": "none", main_arm: "gguf"}
    eng = {n: TandemArm({"quantization": q, "quant_activations": None if q == "none" else ns.activations[0],
                         "max_num_seqs": 1, "max_num_batched_tokens": 512, "enable_prefix_caching": False})
           for n, q in pre_arms.items()}
    pre: dict[str, list[float]] = {n: [] for n in eng}
    for _ in range(3):
        for n, w in eng.items():
            pre[n].append(512 / w.ask(cmd="prefill", ids=long_ids)["prefill_s"])
    for w in eng.values():
        w.close()
    prefill = [{"arm": n, "prefill_tok_s": max(v)} for n, v in pre.items()]
    return {"resident_memory": resident_memory(), "single_stream": single, "batch16": batch16, "prefill_512": prefill,
            "read_bandwidth_GB_s": bw, "outputs_equal_to_main_arm": same, "main_arm": main_arm,
            "weight_bytes": weight_bytes, "llamacpp_system_info": peer.info.get("system_info") if peer else None}


def _teacher_forced(model: CausalLM, prompt: list[int], cont: list[int]) -> torch.Tensor:
    """Log-probabilities at each continuation position, one decode step at a time after a prefill."""
    a = model.args
    n = len(prompt) + len(cont)
    bs = 16
    cache = KVCache.allocate(a.num_hidden_layers, n // bs + 2, bs, a.num_key_value_heads, a.head_dim, torch.float32, "cpu")
    blocks = list(range(n // bs + 2))
    out = []
    batch = build_forward_batch([PagedRequest(prompt, 0, blocks)], bs, "cpu", last_token_logits_only=True)
    h = model(batch, cache).hidden_states[batch.logits_indices]
    out.append(model.compute_logits(h)[0])
    seq = list(prompt)
    for t in cont[:-1]:
        batch = build_forward_batch([PagedRequest([t], len(seq), blocks)], bs, "cpu", last_token_logits_only=True)
        seq.append(t)
        h = model(batch, cache).hidden_states[batch.logits_indices]
        out.append(model.compute_logits(h)[0])
    return torch.log_softmax(torch.stack(out).double(), dim=-1)


def _compare(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    top1 = float((ref.argmax(-1) == got.argmax(-1)).double().mean())
    kl = float((ref.exp() * (ref - got)).sum(-1).mean())
    return top1, kl


_RSS_SNIPPET = """
import sys
from tandem import LLM
llm = LLM(quantization=sys.argv[1])
rss = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS'))
print(rss, llm.engine_plan.num_kv_blocks * llm.engine_plan.bytes_per_block, llm.engine_plan.weight_bytes)
"""


def resident_memory() -> list[dict[str, Any]]:
    """RSS of a fresh process right after ``LLM()`` (default KV budget), per quantization."""
    file_bytes = resolve_model(MODEL).stat().st_size
    out = []
    for q in ("gguf", "none"):
        line = subprocess.run([sys.executable, "-c", _RSS_SNIPPET, q], capture_output=True, text=True,
                              check=True).stdout.split()
        rss, kv, weights = (int(v) for v in line[-3:])
        out.append({"quantization": q, "rss_bytes": rss, "kv_cache_bytes": kv, "weight_bytes": weights,
                    "file_bytes": file_bytes, "rss_minus_file_and_kv": rss - file_bytes - kv})
    return out


def plot(res: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    single = res["single_stream"]
    axes[0].barh([r["arm"] for r in single], [r["decode_tok_s"] for r in single], color="tab:blue")
    axes[0].set_xlabel("decode tok/s, single stream")
    b16 = res["batch16"]
    axes[1].barh([r["arm"] for r in b16], [r["decode_tok_s"] for r in b16], color="tab:green")
    axes[1].set_xlabel("aggregate decode tok/s, 16 sequences")
    for ax in axes:
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("SmolLM2-135M Q4_1, 2 threads: tandem vs llama.cpp (same file, same token ids)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_accuracy(ns: argparse.Namespace) -> dict[str, Any]:
    path = resolve_model(MODEL)
    prompts = humaneval(ns.prompts)
    llm = LLM(MODEL, quantization="none", max_num_seqs=8)
    tok = llm.get_tokenizer()
    ids = [tok.encode(p) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=ns.max_tokens, ignore_eos=True)
    conts = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in ids], params)]
    llm.shutdown()
    fp32 = load_checkpoint(MODEL)
    mf = CausalLM.from_tensors(fp32.args, fp32.tensors)
    del fp32
    q = load_checkpoint(MODEL, keep_quantized=True)
    mq = {a: CausalLM.from_tensors(q.args, q.tensors, quant_activations=a) for a in ns.activations}
    del q
    peer = LlamaCpp(ns.llamacpp_python, path, 1) if ns.llamacpp_python else None
    per = []
    with torch.inference_mode():
        for p, c in tqdm(list(zip(ids, conts)), desc="teacher-forced"):
            ref = _teacher_forced(mf, p, c)
            row = {}
            for a, m in mq.items():
                row.update(zip((f"tandem_{a}_top1", f"tandem_{a}_kl"), _compare(ref, _teacher_forced(m, p, c))))
            if peer:
                with tempfile.NamedTemporaryFile(suffix=".npy") as f:
                    peer.ask(cmd="logits", ids=p + c, out=f.name)
                    lg = torch.from_numpy(np.load(f.name))[len(p) - 1 : len(p) + len(c) - 1].double()
                row.update(zip(("llamacpp_top1", "llamacpp_kl"), _compare(ref, torch.log_softmax(lg, -1))))
            per.append(row)
    if peer:
        peer.close()
    summary = {k: float(np.mean([r[k] for r in per])) for k in per[0]}
    return {"summary": summary, "per_prompt": per, "positions": len(per) * ns.max_tokens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["speed", "accuracy"], default="speed")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="16-way rounds per engine")
    ap.add_argument("--spec", nargs="*", default=["eagle3", "mtp"])
    ap.add_argument("--activations", nargs="*", default=["int8x2", "float32", "int8"],
                    help="gguf arms' quant_activations; the first is the main arm (spec, 16-way, prefill)")
    ap.add_argument("--arm-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--llamacpp-python", default=".venv-llamacpp/bin/python",
                    help="the peer venv's python ('' to skip llama.cpp)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="speed mode: a PNG of the decode rates")
    ns = ap.parse_args(argv)
    if ns.arm_worker:
        arm_worker(json.loads(ns.arm_worker))
        return 0
    torch.set_num_threads(2)
    if ns.llamacpp_python and not Path(ns.llamacpp_python).exists():
        ap.error(f"{ns.llamacpp_python} not found: run benchmarks/peers/setup_llamacpp.sh (or pass '')")
    load_before = os.getloadavg()  # the machine's load: another process on a core slows llama.cpp 10-40x
    res = run_speed(ns) if ns.mode == "speed" else run_accuracy(ns)
    res["loadavg_before"], res["loadavg_after"] = load_before, os.getloadavg()
    print(json.dumps(res, indent=1, default=str))
    if ns.plot and ns.mode == "speed":
        plot(res, ns.plot)
    if ns.json:
        Path(ns.json).write_text(json.dumps({"environment": environment(), "args": vars(ns), **res}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
