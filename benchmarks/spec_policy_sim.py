"""One stream under the speculation policy, simulated: the policy of this checkout (core/spec_policy.py) decides
each step, a step's time is drawn from a cost line with noise, and drafts are accepted as a Bernoulli chain —
so a policy change can be judged over 20,000 steps in seconds, without the 4-7 % run-to-run spread of a served
run on these VMs. The defaults are eagle3's at one stream on the AMD EPYC (a server's in-process trace,
``spec_policy_state.py``): 4.5 ms fixed, 0.8 ms a logits row, 0.9 ms a head pass; step times with a 0.4 ms
spread and 3 % of them 4 ms late; the level 12 % higher for 4,000-step stretches (the vCPUs' placement).

    python benchmarks/spec_policy_sim.py --acceptance 0.43 0.34 0.34 --temperature 0.7
    python benchmarks/spec_policy_sim.py --acceptance 0.30 --temperature 1.0 --seeds 8

Prints tokens per second of no speculation and each arm's ratio to it (mean over seeds, and their range).
"""

from __future__ import annotations

import argparse
import random
import sys
import types

from tandem.core.request import Request
from tandem.core.spec_policy import make_policy
from tandem.sampling_params import SamplingParams


def simulate(policy: str, k: int, acceptance: list[float], temperature: float, ns: argparse.Namespace,
             seed: int) -> float:
    """Tokens per simulated second of one stream served ``ns.steps`` steps by ``policy`` (``none``: no drafts)."""
    rng, now = random.Random(seed), [0.0]
    pol = None if policy == "none" else make_policy(policy, k, ns.method, clock=lambda: now[0])
    tokens, n, req, proposed, level = 0, 0, None, 0, 1.0
    for step in range(ns.steps):
        if req is None or req.num_output_tokens >= ns.output_len:
            if req is not None and pol is not None:
                pol.forget(req.request_id)
            n += 1
            req = Request(f"r{n}", [1, 2, 3, 4], SamplingParams(temperature=temperature, max_tokens=ns.output_len),
                          eos_token_ids=frozenset({0}))
            proposed = 0  # (the last step of the one before came back idle: no step period spans the two)
        if step % 4000 == 0:
            level = rng.choice([1.0, 1.12])
        left = ns.output_len - req.num_output_tokens
        verify = propose = 0
        if pol is not None:
            verify = min(pol.plan([(req, min(proposed, k))]).get(req.request_id, 0), proposed, left - 1)
            propose = pol.propose_k
        accepted = 0
        while accepted < verify and rng.random() < acceptance[min(accepted, len(acceptance) - 1)]:
            accepted += 1
        gained = min(accepted + 1, left)
        late = ns.late_s if rng.random() < ns.late_share else 0.0
        dt = level * (ns.fixed_s + ns.row_s * (1 + verify) + ns.pass_s * propose) + rng.gauss(0, ns.noise_s) + late
        now[0] += max(dt, 1e-4)
        tokens += gained
        req.output_token_ids.extend([5] * gained)
        if pol is not None:
            if verify:
                pol.observe_drafts(req, verify, accepted)
            pol.observe_step(types.SimpleNamespace(
                scheduled_spec_decode_tokens={req.request_id: [0] * verify} if verify else {},
                sampling_req_ids={req.request_id}, num_scheduled_tokens={req.request_id: 1 + verify},
                total_num_scheduled_tokens=1 + verify, num_tree_rows=0, draft_trees=False,
                num_drafts_to_propose=propose), busy=req.num_output_tokens < ns.output_len)
        proposed = propose
    return tokens / now[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--acceptance", type=float, nargs="+", default=[0.43, 0.34, 0.34],
                    help="conditional acceptance per draft position (the last repeats)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--method", default="eagle3")
    ap.add_argument("--k", type=int, default=3, help="the adaptive policy's maximum")
    ap.add_argument("--fixed-k", type=int, nargs="*", default=[1, 3])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--fixed-s", type=float, default=4.5e-3)
    ap.add_argument("--row-s", type=float, default=0.8e-3)
    ap.add_argument("--pass-s", type=float, default=0.9e-3)
    ap.add_argument("--noise-s", type=float, default=0.4e-3)
    ap.add_argument("--late-share", type=float, default=0.03)
    ap.add_argument("--late-s", type=float, default=4e-3)
    ns = ap.parse_args()
    seeds = range(ns.seeds)
    base = [simulate("none", ns.k, ns.acceptance, ns.temperature, ns, s) for s in seeds]
    print(f"no speculation: {sum(base) / len(base):.1f} tok/s", flush=True)
    for name, k in [*(("fixed", j) for j in ns.fixed_k), ("adaptive", ns.k)]:
        ratios = [simulate(name, k, ns.acceptance, ns.temperature, ns, s) / b for s, b in zip(seeds, base)]
        print(f"{name} k={k}: {sum(ratios) / len(ratios):.3f} x  [{min(ratios):.3f}, {max(ratios):.3f}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
