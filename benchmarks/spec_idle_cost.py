"""What a speculative method costs while the policy drafts (almost) nothing: every arm an engine in its own
process (two engines in one process collapse, BENCHMARKS.md §13), the same batch of HumanEval prompts served
several times in each (the first pass a warm-up, not counted), arms taking turns process by process.

Per pass: output tok/s, the drafts verified, and the step's time split into the model's forward
(``CausalLM.forward``, timed around every call) and everything else (scheduling, sampling, drafting, the
policy, output handling). A method whose drafts do not pay at this load should cost what no speculation costs;
the difference in "everything else" is what having it configured costs.

    python benchmarks/spec_idle_cost.py --methods none suffix ngram eagle3 --temperature 0.7 --concurrency 4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import core_round_trip_ns, environment, humaneval, placement_of  # noqa: E402


def child(method: str, temperature: float, concurrency: int, passes: int, num_prompts: int, output_len: int) -> None:
    """One arm: ``passes`` + 1 passes over the prompts, one JSON line a pass (pass 0: the warm-up, the engine's
    first load — not counted in the summary, reported apart), each labelled with the vCPUs' placement over it."""
    from tandem import LLM, SamplingParams
    from tandem.model import transformer

    forward = {"s": 0.0, "n": 0}
    inner = transformer.CausalLM.forward

    def timed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            forward["s"] += time.perf_counter() - t0
            forward["n"] += 1

    transformer.CausalLM.forward = timed
    kw = {} if method == "none" else {"speculative_config": {"method": method, "num_speculative_tokens": 3}}
    llm = LLM(max_num_seqs=concurrency, **kw)
    prompts = humaneval(num_prompts)
    sp = SamplingParams(max_tokens=output_len, temperature=temperature, ignore_eos=True)
    for i in range(passes + 1):
        forward.update(s=0.0, n=0)
        before = core_round_trip_ns()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        seconds = time.perf_counter() - t0
        stats = llm.spec_decode_stats() if method != "none" else {}
        if method != "none":
            llm.reset_spec_decode_stats()
        placement = placement_of(before, core_round_trip_ns())
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)  # pass 0: the engine's first load (warm-up)
        print(json.dumps({"method": method, "pass": i, "tok_s": tokens / seconds, "seconds": seconds,
                          "placement": placement,
                          "forward_s": forward["s"], "forwards": forward["n"],
                          "other_s": seconds - forward["s"], "drafts": stats.get("num_draft_tokens", 0)}),
              flush=True)


def summarize(rows: list[dict], methods: list[str]) -> dict[str, dict[str, float]]:
    """Per method: the mean tok/s, forward and other seconds and drafts of its passes among ``rows``."""
    out = {}
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        if mine:
            n = len(mine)
            out[m] = {k: sum(r[k] for r in mine) / n for k in ("tok_s", "forward_s", "other_s", "drafts")} | {"n": n}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=["none", "suffix", "ngram", "eagle3"])
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="processes per arm, arms taking turns")
    ap.add_argument("--passes", type=int, default=3, help="counted passes per process (after one warm-up)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "spec_idle_cost.json"))
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        m, t, c, p, n, o = ns.child
        child(m, float(t), int(c), int(p), int(n), int(o))
        return 0
    rows = []
    total = ns.rounds * len(ns.methods)
    for r in range(ns.rounds):
        order = ns.methods[r % len(ns.methods):] + ns.methods[: r % len(ns.methods)]
        for m in order:
            cmd = [sys.executable, __file__, "--child", m, str(ns.temperature), str(ns.concurrency), str(ns.passes),
                   str(ns.num_prompts), str(ns.output_len)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            got = [json.loads(line) | {"round": r} for line in out.splitlines() if line.startswith("{")]
            rows += got
            print(f"[{len(rows) // (ns.passes + 1)}/{total}] {m}: " + ", ".join(f"{g['tok_s']:.1f} tok/s "
                  f"(other {g['other_s']:.2f} s, drafts {g['drafts']})" for g in got), flush=True)
    print("| method | tok/s | x none | forward s a pass | other s a pass | other - none's | drafts a pass |")
    print("|---|---|---|---|---|---|---|")
    counted = [r for r in rows if r["pass"] > 0]
    summary = summarize(counted, ns.methods)
    base = summary.get("none")
    for m, s in summary.items():
        ratio = f"{s['tok_s'] / base['tok_s']:.3f}" if base else "-"
        extra = f"{s['other_s'] - base['other_s']:+.3f}" if base else "-"
        print(f"| {m} | {s['tok_s']:.1f} | {ratio} | {s['forward_s']:.3f} | {s['other_s']:.3f} | {extra} "
              f"| {s['drafts']:.0f} |")
    by_placement = {}
    for label, subset in [("first pass (warm-up)", [r for r in rows if r["pass"] == 0])] + [
            (f"{p} passes", [r for r in counted if r["placement"] == p]) for p in ("near", "far")]:
        got = summarize(subset, ns.methods)
        by_placement[label] = got
        if "none" in got:
            print(f"{label}: " + ", ".join(f"{m} {s['tok_s']:.1f} tok/s ({s['tok_s'] / got['none']['tok_s']:.3f}x, "
                                           f"{s['n']} passes)" for m, s in got.items()))
    Path(ns.json).write_text(json.dumps({"environment": environment(), "args": vars(ns), "runs": rows,
                                         "summary": summary, "by_placement": by_placement}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
