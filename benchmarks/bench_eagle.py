"""EAGLE / EAGLE-3 / MTP with the shipped drafters on the default model (issue 6).

Two measurements, on HumanEval prompts (held out: the drafters were trained on standard-library prompts),
greedy, k = 3:

- ``--mode speed`` (single stream): mean acceptance length (tokens per verify step, bonus included),
  acceptance per draft position, output tok/s end to end (prefill included) and in the decode phase alone
  (first token to last, per request: the TPOT), each with its speed-up over no-spec in the same run (every
  arm's engine loaded, the arms taking turns prompt by prompt; totals over all prompts and repeats), and the
  same for the first ``--subset`` prompts;
- ``--mode equality``: 32 prompts at concurrency 8, async off and on, each method against no-spec; a
  divergence counts as a near-tie only if the target's top-2 log-probabilities at the first differing
  position are within ``--tie-eps`` (checked by re-running the target on the common prefix).

    python benchmarks/bench_eagle.py --mode speed --json benchmarks/results/eagle_speed.json
    python benchmarks/bench_eagle.py --mode equality --json benchmarks/results/eagle_equality.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, humaneval  # noqa: E402

from tandem import LLM, SamplingParams  # noqa: E402

METHODS = ("eagle", "eagle3", "mtp")
EQUALITY_METHODS = (*METHODS, "ngram", "draft_model")  # --mode equality also takes the model-free and draft-model methods


def spec(arm: str, k: int, draft_dtype: str | None = None, tree: str | None = None,
         policy: str | None = None) -> dict[str, Any] | None:
    """An arm is a method, optionally with its own draft dtype after a colon (``eagle:int8``); ``tree``
    ``TOP_K,MAX_NODES`` drafts trees (speculative_config.tree) with the draft heads."""
    if arm == "none":
        return None
    method, _, own = arm.partition(":")
    out: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if own or draft_dtype is not None:
        out["draft_dtype"] = own or draft_dtype
    if tree and method in ("eagle", "eagle3", "mtp"):
        top_k, max_nodes = (int(v) for v in tree.split(","))
        out["tree"] = {"top_k": top_k, "max_nodes": max_nodes}
    if policy:
        out["policy"] = policy
    return out


def _arm(value: str) -> str:
    method, _, dtype = value.partition(":")
    if method not in EQUALITY_METHODS or dtype not in ("", "auto", "float32", "bfloat16", "int8", "q8_0"):
        raise argparse.ArgumentTypeError(
            f"{value!r}: a method of {METHODS}, optionally :auto|float32|bfloat16|int8|q8_0")
    return value


def _arm_result(m: str, e2e: float, n_dec: int, t_dec: float, s: dict[str, Any], toks: list[list[int]],
                ref: list[list[int]], base: tuple[float, float]) -> dict[str, Any]:
    drafts = int(s.get("num_drafts", 0) or 0)
    per_pos = [a / drafts for a in s.get("accepted_per_pos", [])] if drafts else []
    return {
        "method": m,
        "tok_s": sum(len(t) for t in toks) / e2e,
        "speedup_vs_none": base[0] / e2e,
        # Decode only (TPOT): the prefill (the same for every arm, plus the head's pass over the prompt
        # for the drafters) is left out.
        "decode_tok_s": n_dec / t_dec,
        "decode_speedup_vs_none": (n_dec / t_dec) / base[1],
        "mean_acceptance_length": s.get("mean_acceptance_length"),
        "acceptance_rate": s.get("acceptance_rate"),
        "accepted_per_pos": s.get("accepted_per_pos"),
        "acceptance_per_pos": [round(x, 3) for x in per_pos],
        "num_drafts": drafts,
        "identical_to_no_spec": toks == ref,
        "e2e_s": e2e,
        "decode_s": t_dec,
    }


def run_speed(ns: argparse.Namespace) -> dict[str, Any]:
    """Every arm's engine is loaded at once and the arms take turns prompt by prompt (the order rotating),
    so this VM's drift over minutes falls on all arms alike; each engine still serves one request at a time
    (single stream) and the others wait idle."""
    prompts = humaneval(ns.prompts)
    params = SamplingParams(temperature=0, max_tokens=ns.max_tokens)
    arms = ["none", *ns.methods]
    engines = {}
    for m in tqdm(arms, desc="load"):
        engines[m] = LLM(max_num_seqs=1, async_scheduling=ns.async_on,
                         speculative_config=spec(m, ns.k, ns.draft_dtype, ns.tree, ns.policy), max_model_len=2048, num_kv_blocks=160)
        engines[m].generate(prompts[0], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
        engines[m].reset_spec_decode_stats()
    # per arm, per prompt: (end-to-end s, tokens after the first, decode s, token ids)
    rows: dict[str, list[tuple[float, int, float, list[int]]]] = {m: [] for m in arms}
    subset_stats: dict[str, dict[str, Any]] = {}
    bar = tqdm(total=len(arms) * len(prompts) * ns.repeats, desc="speed")
    for rep in range(ns.repeats):
        for i, p in enumerate(prompts):
            k = (i + rep) % len(arms)
            for m in arms[k:] + arms[:k]:
                t0 = time.perf_counter()
                o = engines[m].generate(p, params, use_tqdm=False)[0]
                e2e = time.perf_counter() - t0
                x = o.metrics
                rows[m].append((e2e, x.num_generation_tokens - 1, x.last_token_time - x.first_token_time,
                                list(o.outputs[0].token_ids)))
                bar.update(1)
            if rep == 0 and i + 1 == ns.subset:
                subset_stats = {m: engines[m].spec_decode_stats() for m in arms if m != "none"}
    bar.close()
    stats = {m: engines[m].spec_decode_stats() for m in arms if m != "none"}
    for llm in engines.values():
        llm.shutdown()

    def summarize(n: int | None, st: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        sel = {m: [r for j, r in enumerate(rows[m]) if n is None or j % len(prompts) < n] for m in arms}
        tot = {m: (sum(r[0] for r in v), sum(r[1] for r in v), sum(r[2] for r in v)) for m, v in sel.items()}
        base = (tot["none"][0], tot["none"][1] / tot["none"][2])
        ref = [r[3] for r in sel["none"]]
        return [_arm_result(m, *tot[m], st.get(m, {}), [r[3] for r in sel[m]], ref, base) for m in arms]

    results = summarize(None, stats)
    subset = summarize(ns.subset, subset_stats) if 0 < ns.subset < len(prompts) else []
    for title, res in (("all prompts", results), (f"first {ns.subset} prompts", subset)):
        if not res:
            continue
        print(f"\n{title}\n{'method':<12}{'tok/s':>8}{'speedup':>9}{'decode tok/s':>13}{'speedup':>9}"
              f"{'acc.len':>9}{'per position':>22}{'same':>6}")
        for r in res:
            acc = r["mean_acceptance_length"]
            print(f"{r['method']:<12}{r['tok_s']:>8.1f}{r['speedup_vs_none']:>8.2f}x"
                  f"{r['decode_tok_s']:>13.1f}{r['decode_speedup_vs_none']:>8.2f}x"
                  f"{(acc if acc is not None else float('nan')):>9.2f}{str(r['acceptance_per_pos']):>22}"
                  f"{str(r['identical_to_no_spec']):>6}")
    per_prompt = {m: [{"e2e_s": r[0], "decode_tokens": r[1], "decode_s": r[2]} for r in v] for m, v in rows.items()}
    return {"results": results, "subset": subset, "per_prompt": per_prompt}


def _near_tie(llm: LLM, prompt_ids: list[int], prefix: list[int], eps: float) -> tuple[bool, float]:
    """Whether the target's top-2 log-probabilities after ``prompt_ids + prefix`` are within ``eps``."""
    p = SamplingParams(temperature=0, max_tokens=1, logprobs=2)
    out = llm.generate({"prompt_token_ids": prompt_ids + prefix}, p, use_tqdm=False)[0]
    lp = out.outputs[0].logprobs[0]  # type: ignore[index]
    vals = sorted((v.logprob for v in lp.values()), reverse=True)
    gap = vals[0] - vals[1] if len(vals) > 1 else float("inf")
    return gap <= eps, gap


def run_equality(ns: argparse.Namespace) -> dict[str, Any]:
    prompts = humaneval(ns.prompts)
    params = SamplingParams(temperature=0, max_tokens=ns.max_tokens)
    results = []
    ref: dict[bool, list[list[int]]] = {}
    arms = [(m, a) for a in (False, True) for m in ("none", *ns.methods)]
    probe = None
    prompt_ids: list[list[int]] = []
    for m, a in tqdm(arms, desc="equality"):
        llm = LLM(max_num_seqs=8, async_scheduling=a, speculative_config=spec(m, ns.k, ns.draft_dtype, ns.tree, ns.policy),
                  max_model_len=2048, num_kv_blocks=512, quantization=ns.quantization)
        outs = llm.generate(prompts, params, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        s = llm.spec_decode_stats()
        llm.shutdown()
        if m == "none":
            ref[a] = got
            prompt_ids = [list(o.prompt_token_ids) for o in outs]
            continue
        diverged = []
        for i, (x, y) in enumerate(zip(got, ref[a])):
            if x != y:
                j = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
                if probe is None:
                    probe = LLM(max_num_seqs=1)
                tie, gap = _near_tie(probe, prompt_ids[i], y[:j], ns.tie_eps)
                diverged.append({"prompt": i, "position": j, "near_tie": tie, "top2_gap": gap})
        results.append({"method": m, "async": a, "identical": not diverged, "diverged": diverged,
                        "all_divergences_near_ties": all(d["near_tie"] for d in diverged),
                        "mean_acceptance_length": s.get("mean_acceptance_length"),
                        "accepted_per_pos": s.get("accepted_per_pos"), "num_drafts": s.get("num_drafts")})
    if probe is not None:
        probe.shutdown()
    for m in ns.methods:
        off, on = (next(r for r in results if r["method"] == m and r["async"] == a) for a in (False, True))
        same = (off["accepted_per_pos"], off["num_drafts"]) == (on["accepted_per_pos"], on["num_drafts"])
        print(f"{m:<8} identical off/on: {off['identical']}/{on['identical']}  "
              f"ties-only: {off['all_divergences_near_ties']}/{on['all_divergences_near_ties']}  "
              f"acceptance identical across async: {same}  acc.len {off['mean_acceptance_length']:.3f}")
        off["acceptance_identical_across_async"] = on["acceptance_identical_across_async"] = same
    return {"results": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["speed", "equality"], default="speed")
    p.add_argument("--methods", nargs="+", default=list(METHODS), type=_arm,
                   help="arms: methods, each optionally with its draft dtype (eagle:int8)")
    p.add_argument("--prompts", type=int, default=None, help="HumanEval prompts (speed: 10, equality: 32)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--quantization", default=None, choices=["auto", "gguf", "none"],
                   help="the target's quantization (default auto: the shipped Q4_1 file stays in its blocks)")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--subset", type=int, default=10, help="speed: also report the first N prompts")
    p.add_argument("--async-on", action="store_true", help="speed mode: async scheduling on")
    p.add_argument("--tie-eps", type=float, default=1e-3)
    p.add_argument("--draft-dtype", default=None, choices=["auto", "float32", "bfloat16", "int8", "q8_0"],
                   help="speculative_config.draft_dtype of the heads (default: auto)")
    p.add_argument("--tree", default=None, metavar="TOP_K,MAX_NODES",
                   help="draft trees for the eagle / eagle3 / mtp arms (speculative_config.tree)")
    p.add_argument("--policy", default=None, choices=["adaptive", "fixed"], help="speculative_config.policy")
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    if ns.prompts is None:
        ns.prompts = 10 if ns.mode == "speed" else 32
    out = {"environment": environment(), "args": vars(ns)}
    out |= run_speed(ns) if ns.mode == "speed" else run_equality(ns)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
