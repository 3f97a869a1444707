"""Structured outputs under speculation and async scheduling, through the server (issue 9).

    python benchmarks/bench_structured.py [--num-requests 50] [--arms ...] [--concurrency 8]

Each arm starts ``tandem serve`` (SmolLM2-135M, greedy) with one speculation method (none,
``ngram``, ``draft_model`` with the target as its own draft, ``eagle``) and async scheduling off or
on, and sends the same JSON-schema requests (``tests/structured/schemas.py``: 5 schemas with nested
objects, arrays and enums, 10 prompts each). Checks: every output is JSON that validates against its
schema, and every arm gives the reference arm's (no spec, async off) tokens, or first differs at a
proven near-tie. The ``eagle`` arm uses the shipped head when one exists, else a random head shaped
for the model (``--eagle-head`` to pass one): it tests correctness, not speed.

Writes ``benchmarks/results/structured.json`` (per arm: validity, identity, spec counters, wall
time) after every arm (every output, with tokens and top-2 margins, in ``structured_outputs/``) and
``benchmarks/results/structured_summary.md`` at the end; exits 1 on a failed check.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.structured.serving import (  # noqa: E402
    MODEL,
    check_valid,
    random_eagle_head,
    run_arm,
    same_as_reference,
    select,
    spec_counts,
)

ALL_ARMS = [
    "none:off", "none:on", "ngram:off", "ngram:on", "draft_model:off", "draft_model:on",
    "eagle:off", "eagle:on",
]  # fmt: skip


def _eagle_head(arg: str | None) -> Path | None:
    if arg:
        return Path(arg)
    from tandem.model.loader import load_checkpoint
    from tandem.spec_decode.shipped import shipped_head_for_target

    try:
        shipped = shipped_head_for_target(load_checkpoint(MODEL), "eagle")
    except Exception:  # noqa: BLE001 - no shipped head: fall back to a random one
        shipped = None
    if shipped is not None:
        return None  # the server finds it by itself
    return random_eagle_head(Path(tempfile.mkdtemp(prefix="tandem-eagle-")) / "head")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=50)
    ap.add_argument("--arms", nargs="+", default=ALL_ARMS, help="spec:async, e.g. ngram:on")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--eagle-head", default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "structured.json"))
    args = ap.parse_args()

    reqs = select(list(range(args.num_requests)))
    head = _eagle_head(args.eagle_head) if any(a.startswith("eagle") for a in args.arms) else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "model": MODEL,
        "num_requests": len(reqs),
        "concurrency": args.concurrency,
        "eagle_head": str(head) if head else "shipped",
        "arms": {},
    }
    reference = None
    failed = False
    for arm in args.arms:
        spec_name, async_flag = arm.split(":")
        spec = None if spec_name == "none" else spec_name
        t0 = time.perf_counter()
        run = run_arm(spec, async_flag == "on", reqs, concurrency=args.concurrency,
                      max_tokens=args.max_tokens, eagle_head=head)
        entry: dict[str, Any] = {
            "wall_s": round(run.wall_s, 1),
            "server_s": round(time.perf_counter() - t0, 1),
            "output_tokens": run.num_tokens,
            "tok_s": round(run.num_tokens / run.wall_s, 2),
            **spec_counts(run.metrics),
        }
        try:
            check_valid(reqs, run.results, run.label)
            entry["valid"] = f"{len(reqs)}/{len(reqs)}"
        except AssertionError as exc:
            entry["valid"] = f"FAILED: {exc}"
            failed = True
        if reference is None:
            reference = run.results
            entry["identical"] = "reference"
        else:
            same, notes = 0, []
            for (i, _), r, g in zip(reqs, reference, run.results):
                try:
                    same += same_as_reference(r, g, f"{run.label} #{i}")
                except AssertionError as exc:
                    notes.append(str(exc).splitlines()[0])
                    failed = True
            entry["identical"] = f"{same}/{len(reqs)}"
            entry["near_tie_divergences"] = len(reqs) - same - len(notes)
            if notes:
                entry["mismatches"] = notes
        report["arms"][run.label] = entry
        report["outputs_reference"] = [r.text for r in reference][:5]
        detail = out.with_name(out.stem + "_outputs")
        detail.mkdir(exist_ok=True)
        name = run.label.replace("/", "_").replace("=", "-")
        (detail / f"{name}.json").write_text(json.dumps([vars(r) for r in run.results]))
        out.write_text(json.dumps(report, indent=2))
        print(run.label, json.dumps(entry), flush=True)
    lines = [
        "| arm | valid JSON | identical to reference | drafts | draft tokens | accepted "
        "| invalid (cut) | tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, e in report["arms"].items():
        lines.append(
            f"| {label} | {e['valid']} | {e['identical']} | {e['drafts']:.0f} | "
            f"{e['draft_tokens']:.0f} | {e['accepted_tokens']:.0f} | "
            f"{e['invalid_spec_tokens']:.0f} | {e['tok_s']} |"
        )
    (out.with_name(out.stem + "_summary.md")).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
