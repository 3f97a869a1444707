"""JSON-schema requests through a real ``tandem serve``, for the server test and the benchmark.

``run_arm`` starts one server for one arm (speculation method, async on / off), sends the requests of
``schemas.requests_50()`` (chat with ``response_format`` for most, completions with vLLM's
``guided_json`` for every tenth) at a fixed concurrency, greedy, and returns each output with its
tokens and the top-2 logprob margin per token (for the near-tie rule of ``tests/helpers.py``) plus the
server's metrics once idle. ``check_valid`` and ``compare`` are the acceptance checks: every output is
JSON that validates against its schema, and every arm gives the reference arm's tokens (or first
differs at a proven near-tie).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import openai

from tests.entrypoints.remote import launch
from tests.helpers import NEAR_TIE
from tests.structured.schemas import requests_50

MODEL = "smollm2-135m-instruct"
Request = tuple[str, dict[str, Any], list[dict[str, str]]]


@dataclass
class Result:
    text: str
    tokens: list[str]
    margins: list[float]
    finish: str


@dataclass
class ArmRun:
    label: str
    results: list[Result]
    metrics: dict[str, float]
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.results)


def random_eagle_head(out_dir: Path, model: str = MODEL, seed: int = 0) -> Path:
    """A random single-layer EAGLE head shaped for ``model`` (embedding and LM head shared with the
    target). It drafts noise, so it tests correctness (every draft verified, cut or rejected), not
    speed; a trained head is a drop-in replacement."""
    import torch

    from tandem.model.loader.model_info import load_model_args
    from tandem.spec_decode.eagle_checkpoint import HeadConfig, expected_shapes
    from tandem.spec_decode.head_writer import save_eagle_head

    cfg = HeadConfig.for_target("eagle", load_model_args(model))
    required, _ = expected_shapes(cfg)
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        name: (torch.ones(shape) if name.endswith("norm.weight")
               else torch.randn(*shape, generator=gen) * 0.02)
        for name, shape in required.items()
    }
    return save_eagle_head(out_dir, cfg, tensors, dtype=torch.float32)


def _margin(values: list[float]) -> float:
    values = sorted(values, reverse=True)
    return values[0] - values[1] if len(values) > 1 else float("inf")


async def _one(
    client: openai.AsyncOpenAI, i: int, schema: dict, messages: list, max_tokens: int
) -> Result:
    if i % 10 == 9:  # completions + vLLM's guided_json, on the messages as plain text
        prompt = "\n".join(m["content"] for m in messages) + "\n"
        r = await client.completions.create(
            model=MODEL, prompt=prompt, temperature=0, max_tokens=max_tokens, logprobs=2,
            extra_body={"guided_json": schema},
        )
        c = r.choices[0]
        lp = c.logprobs
        assert lp is not None and lp.top_logprobs is not None and lp.tokens is not None
        margins = [_margin(list(d.values())) for d in lp.top_logprobs]
        return Result(c.text, list(lp.tokens), margins, c.finish_reason)
    r2 = await client.chat.completions.create(
        model=MODEL, messages=messages,  # type: ignore[arg-type]
        temperature=0, max_tokens=max_tokens, logprobs=True, top_logprobs=2,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "record", "schema": schema, "strict": True},
        },
    )
    c2 = r2.choices[0]
    assert c2.logprobs is not None and c2.logprobs.content is not None
    content = c2.logprobs.content
    margins = [_margin([t.logprob for t in e.top_logprobs]) for e in content]
    return Result(c2.message.content or "", [e.token for e in content], margins, c2.finish_reason)


async def _run_all(
    url: str, reqs: list[tuple[int, Request]], concurrency: int, max_tokens: int
) -> list[Result]:
    sem = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600
    ) as client:

        async def guarded(i: int, schema: dict, messages: list) -> Result:
            async with sem:
                return await _one(client, i, schema, messages, max_tokens)

        return await asyncio.gather(*(guarded(i, s, m) for i, (_, s, m) in reqs))


def select(indices: list[int] | None = None) -> list[tuple[int, Request]]:
    """(index into ``requests_50()``, request); the index decides chat vs completions."""
    reqs = requests_50()
    return [(i, reqs[i]) for i in (indices if indices is not None else range(len(reqs)))]


def spec_config(spec: str | None, k: int = 3, eagle_head: Path | None = None) -> dict | None:
    if spec is None:
        return None
    if spec == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k}
    if spec == "draft_model":  # the target as its own draft: every valid draft must be accepted
        return {"method": "draft_model", "num_speculative_tokens": k, "model": MODEL}
    if spec == "eagle":
        cfg: dict[str, Any] = {"method": "eagle", "num_speculative_tokens": k}
        if eagle_head is not None:
            cfg["model"] = str(eagle_head)
        return cfg
    raise ValueError(f"unknown arm {spec!r}")


def run_arm(
    spec: str | None,
    async_on: bool,
    reqs: list[tuple[int, Request]],
    *,
    concurrency: int = 8,
    max_tokens: int = 160,
    eagle_head: Path | None = None,
    extra_flags: tuple[str, ...] = (),
    on_server: Any = None,
) -> ArmRun:
    """One server, one arm: the requests at ``concurrency``, then ``on_server(server)``."""
    flags = ["--max-num-seqs", str(concurrency), "--max-model-len", "1024", *extra_flags,
             "--async-scheduling" if async_on else "--no-async-scheduling"]
    cfg = spec_config(spec, eagle_head=eagle_head)
    if cfg is not None:
        flags += ["--speculative-config", json.dumps(cfg)]
    label = f"{spec or 'no-spec'}/async={'on' if async_on else 'off'}"
    with launch(*flags) as server:
        t0 = time.perf_counter()
        results = asyncio.run(_run_all(server.url, reqs, concurrency, max_tokens))
        wall = time.perf_counter() - t0
        metrics = server.wait_idle()
        if on_server is not None:
            on_server(server)
    return ArmRun(label, results, metrics, wall)


def check_valid(reqs: list[tuple[int, Request]], results: list[Result], label: str = "") -> None:
    for (i, (kind, schema, _)), r in zip(reqs, results):
        assert r.finish == "stop", f"{label} #{i} ({kind}) finished by {r.finish}: {r.text!r}"
        try:
            jsonschema.validate(json.loads(r.text), schema)
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            raise AssertionError(f"{label} #{i} ({kind}) is not valid: {r.text!r}: {exc}") from exc


def same_as_reference(ref: Result, got: Result, label: str) -> bool:
    """True when identical; False when the first difference is at a proven near-tie; else raises."""
    for j, (a, b) in enumerate(zip(ref.tokens, got.tokens)):
        if a != b:
            assert ref.margins[j] < NEAR_TIE, (
                f"{label}: token {j} differs ({a!r} vs {b!r}) with top-2 margin "
                f"{ref.margins[j]:.2e}:\n{ref.text!r}\n{got.text!r}"
            )
            return False
    assert ref.text == got.text, f"{label}: {ref.text!r} vs {got.text!r}"
    return True


def spec_counts(metrics: dict[str, float]) -> dict[str, float]:
    def m(name: str) -> float:
        # vLLM's counters under vllm:, tandem's extra (invalid_spec_tokens) under tandem:
        return metrics.get(f"vllm:spec_decode_{name}_total", metrics.get(f"tandem:spec_decode_{name}_total", 0.0))

    return {
        "drafts": m("num_drafts"),
        "draft_tokens": m("num_draft_tokens"),
        "accepted_tokens": m("num_accepted_tokens"),
        "invalid_spec_tokens": m("num_invalid_spec_tokens"),
    }
