"""``POST /v1/chat/completions``: messages through the model's chat template, streamed or whole; tool calls
(tools.py)."""

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
from tandem.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from tandem.entrypoints.openai.tools import ToolPlan, extract_calls, plan_tools, streamable, template_messages
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


def render_messages(
    ctx: ServerContext, messages: list[ChatMessage], add_generation_prompt: bool, kwargs: dict[str, Any] | None,
    plan: ToolPlan | None = None,
) -> str:
    """The chat template over ``messages`` (and the plan's tools); a template that raises on them is the
    caller's input error."""
    media = next((m.media for m in messages if m.media is not None), None)
    if media is not None:
        kind = "images" if "image" in media else "audio" if "audio" in media else "video" if "video" in media else "files"
        raise APIError(f"{kind} are not supported: this server runs a text-only model (content part {media!r})",
                       400, "messages")
    template = ctx.engine.tokenizer.chat_template
    plain, extra = template_messages(messages, plan, getattr(template, "source", "") or "")
    try:
        return ctx.engine.tokenizer.apply_chat_template(
            plain, add_generation_prompt=add_generation_prompt, **{**(kwargs or {}), **extra}
        )
    except Exception as exc:
        raise APIError(f"cannot apply the chat template: {exc}", 400, "messages") from exc


def _render(ctx: ServerContext, req: ChatCompletionRequest, plan: ToolPlan) -> Prompt:
    text = render_messages(ctx, req.messages, req.add_generation_prompt, req.chat_template_kwargs, plan)
    # The template already holds the special tokens (BOS, role markers): add none on top.
    return Prompt(text, None, add_special_tokens=False)


def _logprobs_content(ctx: ServerContext, d: RequestDelta, top: int) -> list[dict[str, Any]]:
    tok = ctx.engine.tokenizer
    content = []
    for token_id, entries in zip(d.token_ids, d.logprobs or ()):
        sampled = entries.get(token_id)
        alternatives = sorted(
            (
                (tid, lp)
                for tid, lp in entries.items()
                if lp.rank is not None and 1 <= lp.rank <= top
            ),
            key=lambda item: item[1].rank or 0,
        )
        content.append(
            {
                "token": (sampled.decoded_token if sampled else None) or "",
                "logprob": clean_logprob(sampled.logprob) if sampled else None,
                "bytes": list(tok.token_bytes(token_id)),
                "top_logprobs": [
                    {
                        "token": lp.decoded_token or "",
                        "logprob": clean_logprob(lp.logprob),
                        "bytes": list(tok.token_bytes(tid)),
                    }
                    for tid, lp in alternatives
                ],
            }
        )
    return content


async def create_chat_completion(
    ctx: ServerContext, req: ChatCompletionRequest, raw: Request
) -> Response:
    model = ctx.check_model(req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError("top_logprobs needs logprobs=true", 400, "top_logprobs")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    plan = plan_tools(req, ctx.tool_parser)
    prepared = prepare(ctx, req, [_render(ctx, req, plan)], max_tokens, logprobs, "messages",
                       logprobs_param="top_logprobs", structured=plan.structured)
    rid, created = new_id("chatcmpl"), int(time.time())  # the response's "created": this request's arrival
    stream = start(ctx, prepared, rid)
    if req.stream:
        body = guarded(stream, _stream(ctx, req, plan, prepared, stream, rid, created, model))
        return StreamingResponse(
            body, media_type="text/event-stream", background=BackgroundTask(stream.close)
        )
    deltas = await collect(raw, stream)
    if deltas is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    return JSONResponse(_full(ctx, req, plan, prepared, deltas, rid, created, model))


def _full(
    ctx: ServerContext,
    req: ChatCompletionRequest,
    plan: ToolPlan,
    prepared: Prepared,
    deltas: list[RequestDelta],
    rid: str,
    created: int,
    model: str,
) -> dict[str, Any]:
    texts = [""] * req.n
    contents: list[list[dict[str, Any]]] = [[] for _ in range(req.n)]
    final: list[RequestDelta | None] = [None] * req.n
    for d in deltas:
        check_delta(d)
        texts[d.index] += d.text
        if req.logprobs:
            contents[d.index].extend(_logprobs_content(ctx, d, req.top_logprobs or 0))
        if d.finish_reason is not None:
            final[d.index] = d
    choices = []
    for i in range(req.n):
        last = final[i]
        message: dict[str, Any] = {"role": "assistant", "content": texts[i]}
        reason = last.finish_reason if last else None
        if plan.active:
            content, calls = extract_calls(plan, texts[i])
            message = {"role": "assistant", "content": content, "tool_calls": calls}
            reason = "tool_calls" if calls else reason
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": {"content": contents[i]} if req.logprobs else None,
                "finish_reason": reason,
                "stop_reason": last.stop_reason if last else None,
            }
        )
    completion = sum(d.num_output_tokens for d in final if d is not None)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prepared.num_prompt_tokens, completion),
    }


async def _stream(
    ctx: ServerContext,
    req: ChatCompletionRequest,
    plan: ToolPlan,
    prepared: Prepared,
    stream: RequestStream,
    rid: str,
    created: int,
    model: str,
) -> AsyncIterator[str]:
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    produced = [0] * req.n

    def chunk(choice: dict[str, Any]) -> str:
        body: dict[str, Any] = {**head, "choices": [choice]}
        if req.include_usage:
            body["usage"] = (
                usage(prepared.num_prompt_tokens, sum(produced)) if req.continuous_usage else None
            )
        return sse(body)

    for i in range(req.n):  # OpenAI's first chunk per choice carries the role
        yield chunk(
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        )
    texts, sent = [""] * req.n, [0] * req.n  # tools: the output so far, and how much of it went as content
    async for d in stream.deltas():
        check_delta(d)
        produced[d.index] = d.num_output_tokens
        delta: dict[str, Any] = {"content": d.text} if d.text else {}
        reason = d.finish_reason
        if plan.active:  # text that may become a call is held back until the choice ends
            texts[d.index] += d.text
            upto = streamable(plan, texts[d.index]) if reason is None else len(texts[d.index])
            new, sent[d.index] = texts[d.index][sent[d.index]:upto], max(sent[d.index], upto)
            delta = {"content": new} if new else {}
            if reason is not None:
                content, calls = extract_calls(plan, new)
                delta = {"content": content} if content else {}
                if calls:
                    delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(calls)]
                    reason = "tool_calls"
        if not delta and reason is None and not req.logprobs:
            continue  # text held back (a possible stop string, a possible call): nothing to send yet
        choice: dict[str, Any] = {
            "index": d.index,
            "delta": delta,
            "logprobs": (
                {"content": _logprobs_content(ctx, d, req.top_logprobs or 0)}
                if req.logprobs
                else None
            ),
            "finish_reason": reason,
        }
        if d.finish_reason is not None:
            choice["stop_reason"] = d.stop_reason
        yield chunk(choice)
    if req.include_usage:
        yield sse(
            {**head, "choices": [], "usage": usage(prepared.num_prompt_tokens, sum(produced))}
        )
    yield SSE_DONE
