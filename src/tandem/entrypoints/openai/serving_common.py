"""What completions and chat share: the model check, params and prompts to engine inputs, usage,
logprob values, SSE framing, and waiting for a non-streamed result while watching for a
disconnect."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from tandem.engine.async_llm import AsyncLLM, RequestDelta, RequestStream
from tandem.engine.prompts import Prompt
from tandem.entrypoints.openai.errors import APIError, bad_value
from tandem.entrypoints.openai.protocol import MAX_CHOICES, _SamplingRequest
from tandem.entrypoints.openai.tool_parsers import ToolParser
from tandem.sampling_params import SamplingParams

MIN_LOGPROB = -9999.0  # JSON has no -inf; what OpenAI-compatible servers send instead


@dataclass
class ServerContext:
    engine: AsyncLLM
    served_model_names: list[str]
    model_path: str
    created: int = field(default_factory=lambda: int(time.time()))  # the server's start: /v1/models
    tool_parser: ToolParser | None = None  # --enable-auto-tool-choice --tool-call-parser NAME
    open_streams: weakref.WeakSet[RequestStream] = field(default_factory=weakref.WeakSet)

    def end_open_requests(self, message: str) -> int:
        """Shutdown: every request still producing ends now — a stream with an error event and ``[DONE]``, a
        non-streamed request with a 503 — and its samples are aborted. Returns how many were ended."""
        live = [s for s in list(self.open_streams) if s.live]
        for s in live:
            s.interrupt(APIError(message, 503))
        return len(live)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, model: str | None) -> str:
        if model is not None and model not in self.served_model_names:
            raise APIError(f"The model `{model}` does not exist.", 404, "model")
        return model or self.model_name


@dataclass
class Prepared:
    """Engine inputs of one request: prompts with their token ids, one ``SamplingParams`` each."""

    prompts: list[Prompt]
    params: list[SamplingParams]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p.ids or ()) for p in self.prompts)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def prepare(
    ctx: ServerContext,
    req: _SamplingRequest,
    prompts: Sequence[Prompt],
    max_tokens: int | None,
    logprobs: int | None,
    prompt_param: str,
    prompt_logprobs: int | None = None,
    logprobs_param: str = "logprobs",
    structured: dict[str, Any] | None = None,
) -> Prepared:
    """Tokenize, check lengths and build each prompt's ``SamplingParams``; any problem is a 400.

    ``max_tokens`` None means "up to the context length"; a request whose prompt plus ``max_tokens``
    exceeds ``max_model_len`` is refused, as vLLM does, rather than silently cut.
    """
    if len(prompts) * req.n > MAX_CHOICES:
        raise APIError(f"at most {MAX_CHOICES} choices (prompts x n) per request", 400, "n")
    try:  # what the request leaves out: the model's generation defaults (max_tokens: below)
        defaults = {k: v for k, v in ctx.engine.engine.generation_defaults.items() if k != "max_tokens"}
        kw = {**defaults, **req.sampling_kwargs()}
        if structured is not None:  # tool_choice "required" / a named function (tools.py)
            kw["structured_outputs"] = structured
    except ValueError as exc:  # logit_bias keys, or conflicting structured-output fields
        raise bad_value(exc, "logit_bias") from exc
    kw["logprobs"] = logprobs
    kw["prompt_logprobs"] = prompt_logprobs
    kw["max_tokens"] = max_tokens
    try:
        SamplingParams(**kw)  # range errors name their field before any tokenizing
    except ValueError as exc:
        raise bad_value(exc) from exc
    limit = ctx.engine.factory.max_logprobs
    for value, name in ((logprobs, logprobs_param), (prompt_logprobs, "prompt_logprobs")):
        if value is not None and limit != -1 and value > limit:
            raise APIError(f"{name}={value} is more than the server's max_logprobs ({limit})", 400, name)
    factory = ctx.engine.factory
    limit = factory.max_model_len
    out_prompts, out_params = [], []
    for prompt in prompts:
        try:
            ids = factory.prompt_ids(prompt)
        except ValueError as exc:
            raise APIError(str(exc), 400, prompt_param) from exc
        except (TypeError, UnicodeError) as exc:  # e.g. a lone surrogate the tokenizer refuses
            raise APIError(f"the prompt cannot be tokenized: {exc}", 400, prompt_param) from exc
        room = limit - len(ids)
        if max_tokens is not None and max_tokens > room:
            raise APIError(
                f"this model's context is {limit} tokens; the prompt has {len(ids)}, so at most "
                f"{room} can be generated, but max_tokens is {max_tokens}",
                400,
                "max_tokens",
            )
        try:
            params = SamplingParams(**{**kw, "max_tokens": max_tokens or room})
            params.check_vocab(factory.vocab_size)
        except ValueError as exc:
            raise bad_value(exc) from exc
        out_prompts.append(Prompt(prompt.text, tuple(ids)))
        out_params.append(params)
    return Prepared(out_prompts, out_params)


def start(ctx: ServerContext, prepared: Prepared, request_id: str) -> RequestStream:
    try:
        stream = ctx.engine.add_request(prepared.prompts, prepared.params, request_id)
    except ValueError as exc:
        raise bad_value(exc) from exc
    ctx.open_streams.add(stream)
    return stream


def usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }


def clean_logprob(value: float) -> float:
    return MIN_LOGPROB if math.isnan(value) else max(value, MIN_LOGPROB)


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def check_delta(delta: RequestDelta) -> None:
    """A sample the engine failed: surface it (the whole request fails)."""
    if delta.finish_reason == "error":
        raise APIError(f"the engine failed this request: {delta.error}", 500)


async def _wait_disconnect(raw: Request) -> None:
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(raw: Request, stream: RequestStream) -> list[RequestDelta] | None:
    """Every delta of a non-streamed request, or None if the client went away first (the request is
    then aborted at once)."""

    async def gather() -> list[RequestDelta]:
        return [d async for d in stream.deltas()]

    work = asyncio.ensure_future(gather())
    watch = asyncio.ensure_future(_wait_disconnect(raw))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        stream.close()  # aborts whatever is unfinished, at once
        if not work.done():
            work.cancel()
            await asyncio.wait({work})  # let it unwind; never raises
    if work.cancelled():
        return None
    return work.result()


async def guarded(stream: RequestStream, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """Frame a streamed response: an engine failure becomes an error event; the request is aborted
    whatever way the stream ends (disconnect included)."""
    try:
        async for chunk in chunks:
            yield chunk
    except APIError as exc:
        yield sse(
            {
                "error": {
                    "message": exc.message,
                    "type": "InternalServerError",
                    "param": None,
                    "code": exc.status,
                }
            }
        )
        yield SSE_DONE
    except Exception as exc:  # noqa: BLE001 - EngineDeadError and the like: an error event
        yield sse(
            {
                "error": {
                    "message": str(exc),
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            }
        )
        yield SSE_DONE
    finally:
        stream.close()
