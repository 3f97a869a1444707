"""``POST /v1/completions``: text (or token-id) prompts, streamed as SSE or returned whole."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from tandem.engine.async_llm import RequestDelta, RequestStream
from tandem.engine.prompts import Prompt
from tandem.entrypoints.openai.errors import APIError
from tandem.entrypoints.openai.protocol import CompletionRequest
from tandem.entrypoints.openai.serving_common import (
    SSE_DONE,
    Prepared,
    ServerContext,
    check_delta,
    clean_logprob,
    collect,
    guarded,
    new_id,
    prepare,
    sse,
    start,
    usage,
)


def _prompts(req: CompletionRequest) -> list[Prompt]:
    p = req.prompt
    if isinstance(p, str):
        return [Prompt(p, None)]
    if not p:
        raise APIError("prompt must not be empty", 400, "prompt")
    if all(isinstance(x, int) for x in p):
        return [Prompt(None, tuple(p))]  # type: ignore[arg-type]
    if all(isinstance(x, str) for x in p):
        return [Prompt(x, None) for x in p]  # type: ignore[arg-type]
    return [Prompt(None, tuple(x)) for x in p]  # type: ignore[arg-type]


class _Logprobs:
    """The completions API's logprobs object, built token by token for one choice."""

    def __init__(self) -> None:
        self.offset = 0

    def add(self, delta: RequestDelta) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for token_id, entries in zip(delta.token_ids, delta.logprobs or ()):
            sampled = entries.get(token_id)
            text = (sampled.decoded_token if sampled else None) or ""
            out["tokens"].append(text)
            out["token_logprobs"].append(clean_logprob(sampled.logprob) if sampled else None)
            out["top_logprobs"].append(
                {(lp.decoded_token or ""): clean_logprob(lp.logprob) for lp in entries.values()}
            )
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out


def _merge(into: dict[str, list[Any]], more: dict[str, list[Any]]) -> None:
    for key, values in more.items():
        into.setdefault(key, []).extend(values)


async def create_completion(ctx: ServerContext, req: CompletionRequest, raw: Request) -> Response:
    model = ctx.check_model(req.model)
    if req.echo:
        raise APIError("echo is not supported", 400, "echo")
    if req.suffix:
        raise APIError("suffix is not supported", 400, "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError("best_of must equal n (beam search is not supported)", 400, "best_of")
    prepared = prepare(ctx, req, _prompts(req), req.max_tokens, req.logprobs, "prompt")
    rid, created = new_id("cmpl"), int(time.time())  # the response's "created": this request's arrival
    stream = start(ctx, prepared, rid)
    if req.stream:
        body = guarded(stream, _stream(ctx, req, prepared, stream, rid, created, model))
        return StreamingResponse(
            body, media_type="text/event-stream", background=BackgroundTask(stream.close)
        )
    deltas = await collect(raw, stream)
    if deltas is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    return JSONResponse(_full(ctx, req, prepared, deltas, rid, created, model))


def _full(
    ctx: ServerContext,
    req: CompletionRequest,
    prepared: Prepared,
    deltas: list[RequestDelta],
    rid: str,
    created: int,
    model: str,
) -> dict[str, Any]:
    n = len(prepared.params) * req.n
    texts = [""] * n
    lps = [_Logprobs() for _ in range(n)]
    lp_docs: list[dict[str, list[Any]]] = [{} for _ in range(n)]
    final: list[RequestDelta | None] = [None] * n
    for d in deltas:
        check_delta(d)
        texts[d.index] += d.text
        if req.logprobs is not None:
            _merge(lp_docs[d.index], lps[d.index].add(d))
        if d.finish_reason is not None:
            final[d.index] = d
    choices = []
    for i in range(n):
        last = final[i]
        choices.append(
            {
                "index": i,
                "text": texts[i],
                "logprobs": lp_docs[i] if req.logprobs is not None else None,
                "finish_reason": last.finish_reason if last else None,
                "stop_reason": last.stop_reason if last else None,
            }
        )
    completion = sum(d.num_output_tokens for d in final if d is not None)
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prepared.num_prompt_tokens, completion),
    }


async def _stream(
    ctx: ServerContext,
    req: CompletionRequest,
    prepared: Prepared,
    stream: RequestStream,
    rid: str,
    created: int,
    model: str,
) -> AsyncIterator[str]:
    n = len(prepared.params) * req.n
    lps = [_Logprobs() for _ in range(n)]
    produced = [0] * n
    head = {"id": rid, "object": "text_completion", "created": created, "model": model}
    async for d in stream.deltas():
        check_delta(d)
        produced[d.index] = d.num_output_tokens
        if not d.text and d.finish_reason is None and req.logprobs is None:
            continue  # text held back (a possible stop string): nothing to send yet
        chunk: dict[str, Any] = {
            **head,
            "choices": [
                {
                    "index": d.index,
                    "text": d.text,
                    "logprobs": lps[d.index].add(d) if req.logprobs is not None else None,
                    "finish_reason": d.finish_reason,
                    "stop_reason": d.stop_reason,
                }
            ],
        }
        if req.include_usage:
            chunk["usage"] = (
                usage(prepared.num_prompt_tokens, sum(produced)) if req.continuous_usage else None
            )
        yield sse(chunk)
    if req.include_usage:
        yield sse(
            {**head, "choices": [], "usage": usage(prepared.num_prompt_tokens, sum(produced))}
        )
    yield SSE_DONE
