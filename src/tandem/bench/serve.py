"""``tandem bench serve``: drive a running server with streaming completions and measure it
(flags and result keys follow ``vllm bench serve``).

Per request: TTFT (send -> first non-empty text chunk), ITL (gaps between later chunks; a
speculative step that delivers several tokens is one chunk), TPOT ((latency - TTFT) / (output
tokens - 1)) and end-to-end latency. Output token counts come from the server's usage
(``include_usage``). Requests start at ``--request-rate`` (Poisson arrivals; ``inf``: all at once),
at most ``--max-concurrency`` in flight. Speculative-decoding acceptance and the async-scheduling
decision are read from the server's ``/metrics`` before and after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tandem import overrides
from tandem.bench.workloads import DATASETS, BenchRequest, load_workload

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help="server URL (default: http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", default=None, help="model name (default: the server's first model)")
    p.add_argument(
        "--tokenizer", default=None, help="for the random dataset's vocabulary (default: --model)"
    )
    p.add_argument("--api-key", default=None, help="default: env TANDEM_API_KEY")
    p.add_argument("--dataset-name", default="humaneval", choices=DATASETS)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument(
        "--random-output-len",
        "--output-len",
        dest="random_output_len",
        type=int,
        default=64,
        help="output tokens per request (every dataset)",
    )
    p.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate exactly the output length (default on)",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument(
        "--request-rate", type=float, default=float("inf"), help="requests/s; inf: all at once"
    )
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", default=None, help="write the results as JSON here")
    p.add_argument(
        "--metadata", nargs="*", default=[], help="KEY=VALUE pairs stored with the results"
    )
    p.add_argument("--disable-tqdm", action="store_true")


async def _one(
    client: Any, url: str, payload: dict[str, Any], headers: dict[str, str]
) -> RequestResult:
    res = RequestResult()
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"].get("message"))
                    return res
                if chunk.get("usage"):
                    res.prompt_len = chunk["usage"]["prompt_tokens"]
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("text") for c in chunk.get("choices", ())):
                    now = time.perf_counter()
                    if res.ttft == 0.0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
        res.latency = time.perf_counter() - start
        res.ok = res.ttft > 0.0
        if not res.ok:
            res.error = "no output"
    except Exception as exc:  # noqa: BLE001 - a benchmark reports failures, it goes on
        res.error = repr(exc)
    return res


def _stats(name: str, values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {f"mean_{name}_ms": 0.0, **{f"p{p}_{name}_ms": 0.0 for p in PERCENTILES}}
    ordered = sorted(values)
    out = {f"mean_{name}_ms": statistics.fmean(ordered) * scale}
    for p in PERCENTILES:  # nearest rank on the linear interpolation grid, like numpy's default
        pos = (len(ordered) - 1) * p / 100
        lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
        out[f"p{p}_{name}_ms"] = (ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)) * scale
    return out


async def _server_metrics(client: Any, base: str) -> dict[str, Any]:
    """Spec-decode counters and the async decision from /metrics (empty if unavailable)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        resp = await client.get(base + "/metrics")
        families = list(text_string_to_metric_families(resp.text))
    except Exception:  # noqa: BLE001 - a server without /metrics: report nothing
        return {}
    out: dict[str, Any] = {}
    for fam in families:
        for s in fam.samples:
            # vllm: the counters vLLM has too (a vLLM server reports them alike); tandem: its own extras
            if s.name.startswith(("vllm:spec_decode_num_", "tandem:spec_decode_num_")) and "position" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
            elif s.name == "tandem:async_scheduling_info":
                out["async_scheduling"] = {k: v for k, v in s.labels.items() if k != "model_name"}
    return out


async def _model_name(client: Any, base: str, headers: dict[str, str]) -> str:
    resp = await client.get(base + "/v1/models", headers=headers)
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


async def run_benchmark(ns: argparse.Namespace) -> dict[str, Any]:
    import httpx2

    base = (ns.base_url or f"http://{ns.host}:{ns.port}").rstrip("/")
    key = ns.api_key or overrides.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limit = ns.max_concurrency or ns.num_prompts
    limits = httpx2.Limits(max_connections=limit + 2, max_keepalive_connections=limit + 2)
    async with httpx2.AsyncClient(
        timeout=httpx2.Timeout(600.0), limits=limits, trust_env=False
    ) as client:
        model = ns.model or await _model_name(client, base, headers)
        work = load_workload(
            ns.dataset_name,
            ns.num_prompts,
            input_len=ns.random_input_len,
            output_len=ns.random_output_len,
            seed=ns.seed,
            tokenizer=ns.tokenizer or model,
        )

        def payload(req: BenchRequest) -> dict[str, Any]:
            return {
                "model": model,
                "prompt": req.prompt,
                "max_tokens": req.output_len,
                "temperature": ns.temperature,
                "ignore_eos": ns.ignore_eos,
                "stream": True,
                "stream_options": {"include_usage": True},
            }

        url = base + ns.endpoint
        probe = await _one(client, url, {**payload(work[0]), "max_tokens": 2}, headers)
        if not probe.ok:
            raise RuntimeError(f"the test request failed: {probe.error}")
        before = await _server_metrics(client, base)
        bar = None
        if not ns.disable_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(work), desc="requests", unit="req", dynamic_ncols=True)
        sem = asyncio.Semaphore(limit)
        rng = random.Random(ns.seed)

        async def limited(req: BenchRequest) -> RequestResult:
            async with sem:
                res = await _one(client, url, payload(req), headers)
            if bar is not None:
                bar.update(1)
            return res

        t0 = time.perf_counter()
        tasks = []
        for req in work:
            tasks.append(asyncio.create_task(limited(req)))
            if ns.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(ns.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        after = await _server_metrics(client, base)
    return _summarise(ns, model, base, results, duration, before, after)


def _summarise(
    ns: argparse.Namespace,
    model: str,
    base: str,
    results: list[RequestResult],
    duration: float,
    before: dict[str, Any],
    after: dict[str, Any],
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    doc: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "tandem",
        "base_url": base,
        "model_id": model,
        "dataset_name": ns.dataset_name,
        "num_prompts": ns.num_prompts,
        "request_rate": "inf" if ns.request_rate == float("inf") else ns.request_rate,
        "max_concurrency": ns.max_concurrency,
        "output_len": ns.random_output_len,
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        **_stats("ttft", [r.ttft for r in ok]),
        **_stats("tpot", tpots),
        **_stats("itl", [x for r in ok for x in r.itl]),
        **_stats("e2el", [r.latency for r in ok]),
    }
    drafts = after.get("vllm:spec_decode_num_drafts_total", 0) - before.get(
        "vllm:spec_decode_num_drafts_total", 0
    )
    if drafts:
        proposed = after["vllm:spec_decode_num_draft_tokens_total"] - before.get(
            "vllm:spec_decode_num_draft_tokens_total", 0
        )
        accepted = after["vllm:spec_decode_num_accepted_tokens_total"] - before.get(
            "vllm:spec_decode_num_accepted_tokens_total", 0
        )
        doc["spec_decode"] = {
            "num_drafts": drafts,
            "num_draft_tokens": proposed,
            "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / proposed if proposed else 0.0,
            "mean_acceptance_length": 1 + accepted / drafts,
        }
    if "async_scheduling" in after:
        doc["async_scheduling"] = after["async_scheduling"]
    for item in ns.metadata:
        k, _, v = item.partition("=")
        doc.setdefault("metadata", {})[k] = v
    return doc


def print_summary(doc: dict[str, Any]) -> None:
    line = "=" * 50
    print(f"{line}\n{' Serving Benchmark Result ':=^50}")
    rows = [
        ("Successful requests:", doc["completed"]),
        ("Failed requests:", doc["failed"]),
        ("Maximum request concurrency:", doc["max_concurrency"]),
        ("Benchmark duration (s):", f"{doc['duration']:.2f}"),
        ("Total input tokens:", doc["total_input_tokens"]),
        ("Total generated tokens:", doc["total_output_tokens"]),
        ("Request throughput (req/s):", f"{doc['request_throughput']:.2f}"),
        ("Output token throughput (tok/s):", f"{doc['output_throughput']:.2f}"),
        ("Total token throughput (tok/s):", f"{doc['total_token_throughput']:.2f}"),
    ]
    for label, value in rows:
        print(f"{label:<40}{value!s:>10}")
    for name, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
    ):
        print(f"{' ' + title + ' ':-^50}")
        print(f"{'Mean ' + name.upper() + ' (ms):':<40}{doc[f'mean_{name}_ms']:>10.2f}")
        for p in PERCENTILES:
            print(f"{f'P{p} {name.upper()} (ms):':<40}{doc[f'p{p}_{name}_ms']:>10.2f}")
    if "spec_decode" in doc:
        sd = doc["spec_decode"]
        print(f"{' Speculative Decoding ':-^50}")
        print(f"{'Acceptance rate (%):':<40}{sd['acceptance_rate'] * 100:>10.2f}")
        print(f"{'Acceptance length:':<40}{sd['mean_acceptance_length']:>10.2f}")
    print(line)


def main(ns: argparse.Namespace) -> int:
    doc = asyncio.run(run_benchmark(ns))
    print_summary(doc)
    if ns.result_file:
        path = Path(ns.result_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"results written to {path}")
    return 0 if doc["failed"] == 0 else 1


def register(bench: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = bench.add_parser("serve", help="drive a running tandem server with streaming requests")
    add_cli_args(p)
    p.set_defaults(func=main)
