"""Tensor parallelism, the full token check: TP=2 against TP=1 on the default model for 16 HumanEval
prompts, greedy, every arm (the CI test ``tests/distributed/test_tp_engine.py`` runs five of them).

Reference: TP=1, ``uni``, sync, with top-2 logprobs. Each arm is compared prompt by prompt with the
near-tie rule (``tests/helpers.py``): identical, or a first divergence where the reference's top-2
logit margin is below 1e-3. Every TP=2 arm runs with ``debug_invariants``, so the executor also checks
that both ranks sampled the same tokens at every step.

    python benchmarks/check_tp_tokens.py                    # all arms, 24 new tokens
    python benchmarks/check_tp_tokens.py --arms mp-sync ray-async-ngram --max-tokens 16
    python benchmarks/check_tp_tokens.py --arms mp-async-eagle --merge   # add arms to the last result

Writes ``benchmarks/results/tp_tokens.json``; exits 1 if any arm fails the rule.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}
DRAFT = {"method": "draft_model", "num_speculative_tokens": 3}  # the shipped 6-layer draft
EAGLE = {"method": "eagle", "num_speculative_tokens": 3}  # the shipped head for the default model
MTP = {"method": "mtp", "num_speculative_tokens": 3}
EAGLE3 = {"method": "eagle3", "num_speculative_tokens": 3}  # the shipped head
SUFFIX = {"method": "suffix"}  # vLLM's default depth, 24
# Every method, async off and on, under the speculation policy (adaptive, the default): ``mp-sync-ngram`` ...
SPECS = {"ngram": NGRAM, "draft": DRAFT, "eagle": EAGLE, "mtp": MTP, "eagle3": EAGLE3, "suffix": SUFFIX}
ARMS: dict[str, dict[str, Any]] = {
    "mp-sync": {"executor_backend": "mp", "async_scheduling": False},
    "mp-async": {"executor_backend": "mp", "async_scheduling": True},
    **{
        f"mp-{mode}-{name}": {"executor_backend": "mp", "async_scheduling": mode == "async", "speculative_config": spec}
        for name, spec in SPECS.items()
        for mode in ("sync", "async")
    },
    "mp-deferred-ngram": {
        "executor_backend": "mp", "async_scheduling": True, "deferred_reconciliation": True,
        "speculative_config": NGRAM,
    },
    "ray-async": {"executor_backend": "ray", "async_scheduling": True},
    "ray-async-ngram": {"executor_backend": "ray", "async_scheduling": True, "speculative_config": NGRAM},
}


def run_arm(name: str, prompts: list[str], params: Any, reference: list[Any]) -> dict[str, Any]:
    from tandem import LLM
    from tests.helpers import assert_greedy_match

    t0 = time.perf_counter()
    llm = LLM(max_num_seqs=len(prompts), tensor_parallel_size=2, debug_invariants=True, **ARMS[name])
    try:
        start = time.perf_counter() - t0
        t1 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        gen = time.perf_counter() - t1
        identical, near_ties, failures = 0, 0, []
        for i, (ref, out) in enumerate(zip(reference, outs)):
            try:
                same = assert_greedy_match(
                    ref.token_ids, ref.logprobs, out.outputs[0].token_ids, label=f"{name} #{i}"
                )
            except AssertionError as exc:
                failures.append(str(exc))
                continue
            identical += same
            near_ties += not same
        stats = llm.spec_decode_stats() if "speculative_config" in ARMS[name] else None
        return {
            "async": llm.async_scheduling.resolved,
            "identical": identical,
            "near_tie_divergences": near_ties,
            "failures": failures,
            "lockstep_steps_checked": llm.engine.core.executor.lockstep_steps_checked,
            "num_drafts": None if stats is None else stats["num_drafts"],
            # The policy's choices: request-steps by drafts verified (0 .. k), and its name.
            "policy": None if stats is None else stats["policy"]["policy"],
            "verified_k": None if stats is None else stats["policy"]["verified_k"],
            "start_s": round(start, 1),
            "generate_s": round(gen, 1),
        }
    finally:
        llm.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--out", default=str(HERE / "results" / "tp_tokens.json"))
    p.add_argument("--merge", action="store_true", help="update the arms in --out, keep the others")
    ns = p.parse_args()

    from tandem import LLM, SamplingParams
    from tests.helpers import humaneval_prompts

    prompts = list(humaneval_prompts(ns.num_prompts))
    params = SamplingParams(temperature=0.0, max_tokens=ns.max_tokens, ignore_eos=True)
    ref_llm = LLM(max_num_seqs=len(prompts), async_scheduling=False)
    reference = [
        o.outputs[0]
        for o in ref_llm.generate(prompts, params.clone(logprobs=2), use_tqdm=False)
    ]
    ref_llm.shutdown()
    report: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "num_prompts": len(prompts),
        "max_tokens": ns.max_tokens,
        "arms": {},
    }
    ok = True
    for name in ns.arms:
        res = run_arm(name, prompts, params, reference)
        report["arms"][name] = res
        ok &= not res["failures"]
        print(
            f"{name:18s} identical {res['identical']:2d}/{len(prompts)}  near-tie "
            f"{res['near_tie_divergences']}  failures {len(res['failures'])}  lockstep steps "
            f"{res['lockstep_steps_checked']}  drafts {res['num_drafts']}  verified k {res['verified_k']}  "
            f"start {res['start_s']} s  generate {res['generate_s']} s",
            flush=True,
        )
    if ns.merge and Path(ns.out).is_file():
        old = json.loads(Path(ns.out).read_text())
        if (old["num_prompts"], old["max_tokens"]) == (len(prompts), ns.max_tokens):
            report["arms"] = {**old["arms"], **report["arms"]}
            report["command"] = f"{old['command']}; {report['command']}"
            ok &= all(not a["failures"] for a in report["arms"].values())
    report["all_pass"] = ok
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
