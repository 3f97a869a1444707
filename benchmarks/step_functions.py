"""How many tandem functions one steady decode step passes through (issue 21's structure measure).

N greedy streams of the default model are started and stepped until every one is decoding; then one engine
step is run under a profiler installed on the engine thread and on the worker thread (``uni`` executor), and
every distinct tandem function (file, name, first line) that ran is counted, with the files they live in;
"named" leaves out comprehensions, generator expressions and lambdas.

    python benchmarks/step_functions.py                       # no speculation, async on
    python benchmarks/step_functions.py --spec eagle --async 0
    python benchmarks/step_functions.py --list                # print the functions too
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import tandem
from tandem import LLM, SamplingParams

ROOT = str(Path(tandem.__file__).resolve().parent)
SPECS = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 3},
    "eagle": {"method": "eagle", "num_speculative_tokens": 3},
    "eagle-fixed": {"method": "eagle", "num_speculative_tokens": 3, "policy": "fixed"},  # drafts every step
    "eagle3": {"method": "eagle3", "num_speculative_tokens": 3},
    "mtp": {"method": "mtp", "num_speculative_tokens": 3},
}


def count_step(llm: LLM, warm_steps: int) -> Counter[tuple[str, str, int]]:
    for _ in range(warm_steps):
        llm.step()
    seen: Counter[tuple[str, str, int]] = Counter()

    def prof(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(ROOT):
                seen[(code.co_filename[len(ROOT) + 1 :], code.co_qualname, code.co_firstlineno)] += 1

    pool = getattr(llm.engine.core.executor, "_pool", None)
    if pool is not None:
        pool.submit(sys.setprofile, prof).result()
    sys.setprofile(prof)
    try:
        llm.step()
    finally:
        sys.setprofile(None)
        if pool is not None:
            pool.submit(sys.setprofile, None).result()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4, help="streams (default 4)")
    ap.add_argument("--spec", choices=sorted(SPECS), default="none")
    ap.add_argument("--async", dest="async_", type=int, default=1, help="async scheduling 1/0 (default 1)")
    ap.add_argument("--warm", type=int, default=12, help="steps before the counted one (default 12: past the "
                    "prefills and the first decode steps, which build the native layer tables once)")
    ap.add_argument("--list", action="store_true", help="print every function counted")
    ap.add_argument("--json", help="write the counts here")
    args = ap.parse_args()
    llm = LLM(max_num_seqs=args.n, async_scheduling=bool(args.async_), speculative_config=SPECS[args.spec])
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for i in range(args.n):
        llm.add_request(f"def function_{i}(x):\n    ", params)
    seen = count_step(llm, warm_steps=args.warm)
    files = sorted({f for f, _, _ in seen})
    named = [key for key in seen if "<" not in key[1].rsplit(".", 1)[-1]]
    named_files = {f for f, _, _ in named}
    print(f"spec={args.spec} async={args.async_} n={args.n}: {len(named)} named functions in {len(named_files)} "
          f"files ({len(seen)} with comprehensions, {len(files)} files), {sum(seen.values())} calls")
    if args.list:
        for (f, name, line), calls in sorted(seen.items()):
            print(f"  {calls:5d}  {f}:{line} {name}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "spec": args.spec, "async": args.async_, "n": args.n, "named_functions": len(named),
            "named_files": len(named_files), "functions": len(seen), "files": len(files),
            "calls": sum(seen.values()),
            "by_function": {f"{f}:{line} {name}": c for (f, name, line), c in sorted(seen.items())},
        }, indent=1))
    while llm.has_unfinished_requests():
        llm.step()
    llm.shutdown()


if __name__ == "__main__":
    main()
