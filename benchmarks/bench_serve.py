"""Serving benchmark: ``tandem serve`` without and with n-gram speculation, each driven by
``tandem bench serve`` at several concurrencies; one JSON per run under ``benchmarks/results/`` and a
Markdown table of the numbers.

    python benchmarks/bench_serve.py                       # defaults: 32 HumanEval prompts, 64 tokens
    python benchmarks/bench_serve.py --concurrency 1 8 32 --num-prompts 32 --output-len 64

Each arm starts its own server on a free loopback port (``--port 0``) and stops it afterwards. The
exact ``tandem`` commands are printed and stored in the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY = "tandem serve: listening on "
ARMS = {
    "baseline": [],
    "ngram_k3": ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}'],
}


def start_server(flags: list[str], log: Path, src: Path | None = None) -> tuple[subprocess.Popen[bytes], str, list[str]]:
    """A ``tandem serve`` process (``src``: tandem imported from that source tree, first on ``PYTHONPATH``)."""
    cmd = ["tandem", "serve", "--port", "0", "--disable-uvicorn-access-log", *flags]
    out = log.with_suffix(".stdout")
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
    with open(out, "wb") as so, open(log, "wb") as se:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tandem.entrypoints.cli", *cmd[1:]], stdout=so, stderr=se, env=env
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for line in out.read_text().splitlines():
            if line.startswith(READY):
                return proc, line[len(READY) :].strip(), cmd
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError("server did not start")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument(
        "--server-flags", default="--max-num-seqs 32", help="extra `tandem serve` flags"
    )
    ap.add_argument("--out-dir", default=str(Path(__file__).parent / "results"))
    ns = ap.parse_args()
    out_dir = Path(ns.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="tandem-bench-serve-"))  # server logs stay out of results
    rows, commands = [], []
    for arm in ns.arms:
        flags = [*shlex.split(ns.server_flags), *ARMS[arm]]
        proc, url, serve_cmd = start_server(flags, logs / f"serve_{arm}.log")
        commands.append(shlex.join(serve_cmd))
        try:
            for c in ns.concurrency:
                result = Path(os.path.relpath(out_dir / f"serve_{arm}_c{c}.json"))
                bench = [
                    "tandem", "bench", "serve", "--base-url", url, "--dataset-name", "humaneval",
                    "--num-prompts", str(ns.num_prompts), "--random-output-len", str(ns.output_len),
                    "--max-concurrency", str(c), "--seed", "0", "--result-file", str(result),
                    "--metadata", f"arm={arm}", "--disable-tqdm",
                ]  # fmt: skip
                commands.append(shlex.join(bench).replace(url, "http://127.0.0.1:PORT"))
                subprocess.run(
                    [sys.executable, "-m", "tandem.entrypoints.cli", *bench[1:]], check=True
                )
                doc = json.loads(result.read_text())
                rows.append((arm, c, doc))
        finally:
            stop_server(proc)
    lines = [
        (
            "| arm | concurrency | req/s | output tok/s | TTFT mean / p50 / p99 (ms) | "
            "TPOT mean / p50 / p99 (ms) | ITL mean / p50 / p99 (ms) | acceptance | failed |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, c, d in rows:
        sd = d.get("spec_decode")
        acc = f"{sd['acceptance_rate']:.2f} (len {sd['mean_acceptance_length']:.2f})" if sd else "-"
        lines.append(
            f"| {arm} | {c} | {d['request_throughput']:.2f} | {d['output_throughput']:.1f} | "
            f"{d['mean_ttft_ms']:.0f} / {d['p50_ttft_ms']:.0f} / {d['p99_ttft_ms']:.0f} | "
            f"{d['mean_tpot_ms']:.1f} / {d['p50_tpot_ms']:.1f} / {d['p99_tpot_ms']:.1f} | "
            f"{d['mean_itl_ms']:.1f} / {d['p50_itl_ms']:.1f} / {d['p99_itl_ms']:.1f} | "
            f"{acc} | {d['failed']} |"
        )
    summary = "\n".join(lines) + "\n\nCommands:\n\n" + "\n".join(f"    {c}" for c in commands)
    (out_dir / "serve_summary.md").write_text(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
