"""tandem on a CUDA device: the paths the CPU machines never run, exercised, checked and timed.

The real models' files cannot reach the GPU machines lent to a session (94 MB for the default model, over
what travels there), so the model is the default model's *shape* — its config and tokenizer exported here:
SmolLM2-135M, 30 layers, hidden 576, vocabulary 49,152, tied embeddings — with random weights drawn by
transformers from a fixed seed on that machine. Acceptance therefore means nothing (the shipped eagle3 head
was trained for the real weights); what the run shows is that every path works on the device and what each
kind of step costs there.

Arms, each an engine in this process (1 GiB of KV each), taking turns run by run: ``sync`` and ``async``
without speculation; ``ngram`` (k 3), ``eagle3`` (the shipped head, a chain of 3) and ``tree`` (the same head,
top-k 4, 16 nodes), all async with ``policy: fixed`` (every step verifies all of its drafts); on request
(``--arms``) also ``suffix`` (fixed, its default depth 24) and ``ngram_adaptive`` / ``eagle3_adaptive`` (k 3
under the adaptive policy, which fits the step's cost on the device). At each
concurrency c, c prompts generate ``--max-tokens`` tokens each, greedy, EOS ignored. Checked: every arm's
tokens equal the sync arm's (in float32 with TF32 off, the default here). A traced sync and async run per
concurrency give the overlap analysis.

    python benchmarks/bench_cuda.py --export-shape .gpu/shape      # here: config + tokenizer, no weights
    python benchmarks/bench_cuda.py --shape .gpu/shape --json out.json   # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, grouped_bars  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402

ARMS: dict[str, dict[str, Any]] = {
    "sync": {"async_scheduling": False},
    "async": {"async_scheduling": True},
    "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "policy": "fixed"}},
    "eagle3": {"speculative_config": {"method": "eagle3", "num_speculative_tokens": 3, "policy": "fixed",
                                      "model": "smollm2-135m-instruct-eagle3"}},
    "tree": {"speculative_config": {"method": "eagle3", "num_speculative_tokens": 3, "policy": "fixed",
                                    "model": "smollm2-135m-instruct-eagle3",
                                    "tree": {"top_k": 4, "max_nodes": 16}}},
    "suffix": {"speculative_config": {"method": "suffix", "policy": "fixed"}},
    "ngram_adaptive": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
    "eagle3_adaptive": {"speculative_config": {"method": "eagle3", "num_speculative_tokens": 3,
                                               "model": "smollm2-135m-instruct-eagle3"}},
}
DEFAULT_ARMS = ["sync", "async", "ngram", "eagle3", "tree"]


def export_shape(out: Path) -> None:
    """The default model's config (as a Hugging Face Llama config) and tokenizer files, without weights."""
    from tandem.model.loader import load_checkpoint, resolve_model
    from tandem.spec_decode.make_draft import hf_config, save_tokenizer

    ckpt = load_checkpoint(resolve_model("smollm2-135m-instruct"), torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(ckpt.args, ckpt.args.num_hidden_layers, torch.float32)
    config["pad_token_id"] = ckpt.tokenizer.pad_token_id
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(ckpt, out)


def random_weights(shape: Path, out: Path) -> Path:
    """``shape``'s config with weights drawn by transformers (seed 0), saved with its tokenizer in ``out``."""
    import shutil

    import transformers

    out.mkdir(parents=True, exist_ok=True)
    for f in shape.iterdir():
        shutil.copy(f, out / f.name)
    config = transformers.LlamaConfig.from_dict(json.loads((shape / "config.json").read_text()))
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(out)
    return out


def prompts(n: int) -> list[str]:
    subjects = ["a queue", "a parser", "the cache", "a tokenizer", "the scheduler", "a matrix", "the server"]
    return [f"def step_{i}(x):\n    \"\"\"Update {subjects[i % len(subjects)]} with x, case {i}.\"\"\"\n"
            for i in range(n)]


def run(llm: LLM, plist: list[str], params: SamplingParams) -> tuple[float, list[list[int]]]:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    outs = llm.generate(plist, params, use_tqdm=False)
    sync()
    return time.perf_counter() - t0, [list(o.outputs[0].token_ids) for o in outs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export-shape", type=Path, help="write the default model's config + tokenizer here, then exit")
    p.add_argument("--shape", type=Path, help="a directory written by --export-shape")
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/tandem-cuda-model"))
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of this script here")
    p.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--plot", help="a bar chart of tok/s per arm and concurrency (with --from-json: no run)")
    p.add_argument("--from-json", nargs="+", help="plot these results files instead of running")
    ns = p.parse_args(argv)
    if ns.from_json:
        plot([json.loads(Path(f).read_text()) for f in ns.from_json], ns.plot)
        return 0
    if ns.export_shape:
        export_shape(ns.export_shape)
        return 0
    if ns.shape is None:
        p.error("--shape (or --export-shape) is needed")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = str(random_weights(ns.shape, ns.model_dir))
    from tandem.execution import resolve_execution
    from tandem.trace.analyze import analyze_spans

    # The host (CPU kind, load average, commit) as every benchmark records it; the GPU and what runs on it.
    env = environment() | {"gpu": torch.cuda.get_device_name() if ns.device != "cpu" else None,
                           "dtype": ns.dtype, "execution": resolve_execution(ns.device).as_dict()}
    out: dict[str, Any] = {"environment": env, "args": {k: str(v) for k, v in vars(ns).items()}, "results": []}
    params = SamplingParams(temperature=0, max_tokens=ns.max_tokens, ignore_eos=True)
    bar = tqdm(total=len(ns.concurrency) * (len(ns.arms) * (ns.repeats + 1) + 2), desc="bench_cuda")
    for c in ns.concurrency:
        plist = prompts(c)
        llms = {a: LLM(model, device=ns.device, dtype=ns.dtype, max_num_seqs=c, max_model_len=1024, **ARMS[a])
                for a in ns.arms}
        times: dict[str, list[float]] = {a: [] for a in ns.arms}
        tokens: dict[str, list[list[int]]] = {}
        for a, llm in llms.items():  # warm-up
            run(llm, plist, params)
            bar.update(1)
        for r in range(ns.repeats):
            order = ns.arms[r % len(ns.arms):] + ns.arms[:r % len(ns.arms)]
            for a in order:
                llms[a].reset_spec_decode_stats()
                dt, tokens[a] = run(llms[a], plist, params)
                times[a].append(dt)
                bar.update(1)
        stats = {a: llms[a].spec_decode_stats() for a in ns.arms if "speculative_config" in ARMS[a]}
        resolved = {a: llms[a].async_scheduling.resolved for a in ns.arms}
        for llm in llms.values():
            llm.shutdown()
        traced = {}
        for a in ("sync", "async"):
            llm = LLM(model, device=ns.device, dtype=ns.dtype, max_num_seqs=c, max_model_len=1024,
                      trace_file="/dev/null", **ARMS[a])
            run(llm, plist, params)
            traced[a] = analyze_spans(llm.engine.tracer.spans, steady_reqs=c).summary
            llm.shutdown()
            bar.update(1)
        base = tokens.get("sync")
        n = c * ns.max_tokens
        row = {
            "concurrency": c,
            "tokens": n,
            "tok_s": {a: n / sorted(t)[len(t) // 2] for a, t in times.items()},
            "runs_s": times,
            "equal_to_sync": {a: (tokens[a] == base) if base is not None else None for a in ns.arms},
            "async_resolved": resolved,
            "spec_stats": stats,
            "trace_summary": traced,
        }
        out["results"].append(row)
    bar.close()
    print(f"\n{env}")
    w = max(10, *(len(a) + 1 for a in ns.arms))
    print(f"{'c':>4} " + "".join(f"{a:>{w}}" for a in ns.arms) + "   (tok/s; * = tokens differ from sync)")
    for row in out["results"]:
        cells = "".join(f"{row['tok_s'][a]:>{w - 1}.0f}{'' if row['equal_to_sync'][a] else '*'}" + " "
                        for a in ns.arms)
        print(f"{row['concurrency']:>4} {cells}")
        for a in ("sync", "async"):
            s = row["trace_summary"][a]
            print(f"     {a}: overlapped {s.get('share_steps_overlapped')}, idle gap p50 ms "
                  f"{s.get('device_idle_gap_ms_p50')}")
        for a, st in row["spec_stats"].items():
            print(f"     {a}: mean acceptance length {st.get('mean_acceptance_length')}")
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=2, default=str))
    if ns.plot:
        plot([out], ns.plot)
    return 0


def plot(results: list[dict[str, Any]], path: str) -> None:
    """tok/s per arm, one group per (dtype, concurrency)."""
    rows = [(r["environment"]["dtype"], row) for r in results for row in r["results"]]
    arms = list(rows[0][1]["tok_s"])
    grouped_bars(path, [f"{d} c={row['concurrency']}" for d, row in rows],
                 {a: [row["tok_s"][a] for _, row in rows] for a in arms}, "output tok/s",
                 f"tandem on {results[0]['environment']['gpu']}: SmolLM2-135M's shape, random weights, greedy")


if __name__ == "__main__":
    sys.exit(main())
