"""The ``tandem`` command: generate, chat, config (and more subcommands registered by other modules)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from tandem.utils.argparse_utils import FlexibleArgumentParser
from tandem.entrypoints.engine_args import add_engine_args, engine_kwargs


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--sample-seed", type=int, default=None, help="per-request seed")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--logprobs", type=int, default=None)
    g.add_argument("--ignore-eos", action="store_true")


def _params(ns: argparse.Namespace) -> Any:
    from tandem.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=ns.max_tokens,
        temperature=ns.temperature,
        top_p=ns.top_p,
        top_k=ns.top_k,
        min_p=ns.min_p,
        seed=ns.sample_seed,
        stop=ns.stop,
        logprobs=ns.logprobs,
        ignore_eos=ns.ignore_eos,
    )


def cmd_generate(ns: argparse.Namespace) -> int:
    from tandem.engine.llm import LLM

    params = _params(ns)  # bad sampling flags fail before the model loads
    t0 = time.monotonic()
    llm = LLM(ns.model, **engine_kwargs(ns))
    load_s = time.monotonic() - t0
    prompts = ns.prompt or ["Hello! Who are you?"]
    if ns.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    results = []
    for out in outs:
        c = out.outputs[0]
        m = out.metrics
        assert m is not None
        timings = {
            "load_s": round(load_s, 3),
            "ttft_s": None if m.ttft is None else round(m.ttft, 4),
            "e2e_s": None if m.finished_time is None else round(m.finished_time - m.arrival_time, 4),
            "tpot_s": None if m.tpot is None else round(m.tpot, 5),
        }
        results.append(
            {
                "prompt": out.prompt,
                "text": c.text,
                "token_ids": c.token_ids,
                "finish_reason": c.finish_reason,
                "num_prompt_tokens": len(out.prompt_token_ids),
                "num_cached_tokens": out.num_cached_tokens,
                "timings": timings,
            }
        )
    if ns.json:
        doc = {"async_scheduling": llm.async_scheduling.as_dict(), "outputs": results}
        print(json.dumps(doc if len(results) > 1 else {**doc, **results[0]}, indent=2))
    else:
        for r in results:
            print(r["text"])
        print(f"[{llm.async_scheduling.log_line()}]", file=sys.stderr)
    llm.shutdown()
    return 0


def cmd_chat(ns: argparse.Namespace) -> int:
    from tandem.engine.llm import LLM

    params = _params(ns)
    llm = LLM(ns.model, **engine_kwargs(ns))
    print(f"tandem chat ({ns.model}); empty line or Ctrl-D to quit", file=sys.stderr)
    messages: list[dict[str, str]] = []
    if ns.system:
        messages.append({"role": "system", "content": ns.system})
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        prompt = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        reply = []
        for delta in llm.generate_stream({"prompt": prompt, "add_special_tokens": False}, params):
            reply.append(delta)
            print(delta, end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
    llm.shutdown()
    return 0


def cmd_config(ns: argparse.Namespace) -> int:
    """Print the engine plan and the async decision without loading weights."""
    from tandem.engine.builder import plan_engine
    from tandem.engine.llm import config_from_kwargs

    kw = engine_kwargs(ns)
    plan = plan_engine(config_from_kwargs(ns.model, **kw), log=False)
    if ns.json:
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        for key, value in plan.as_dict().items():
            print(f"{key}: {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = FlexibleArgumentParser(prog="tandem", description=__doc__)  # also --flag_name
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate text for one or more prompts")
    add_engine_args(p)
    _sampling_args(p)
    p.add_argument("--prompt", action="append", help="prompt text (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    p.add_argument("--json", action="store_true", help="print JSON: text, ids, finish reason, timings")
    p.add_argument("--trace", default=None, help="write a Chrome trace (Perfetto) to this file")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive chat, streaming tokens as they come")
    add_engine_args(p)
    _sampling_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.set_defaults(func=cmd_chat, max_tokens=256)

    p = sub.add_parser("config", help="print the engine plan and async decision (no weights loaded)")
    add_engine_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_config)

    from tandem.entrypoints import commands

    commands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(ns.func(ns) or 0)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
