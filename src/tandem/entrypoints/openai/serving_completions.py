"""``POST /v1/completions``: text (or token-id) prompts, streamed as SSE or returned whole.

Prompt scoring, as evaluation harnesses use it: ``echo`` puts the prompt in front of each choice's text and,
with ``logprobs``, the prompt tokens' logprobs in front of the sampled ones (the first prompt token has none:
``null``); ``max_tokens: 0`` (with ``echo``) returns the prompt alone — one token is computed and dropped;
``prompt_logprobs`` (vLLM's extra field) adds every prompt position's top-n logprobs to the choice."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from tandem.engine.async_llm import RequestDelta, RequestStream
from tandem.engine.prompts import Prompt
from tandem.entrypoints.openai.errors import APIError
from tandem.entrypoints.openai.protocol import CompletionRequest
from tandem.outputs import PromptLogprobs
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
    return prompts_of(req.prompt, "prompt")


def prompts_of(p: Any, field: str) -> list[Prompt]:
    """OpenAI's prompt forms (a string, strings, token ids, lists of token ids) as prompts; ``field`` names the
    request field in the 400 for an empty one (``prompt``; ``/v1/embeddings``: ``input``)."""
    if isinstance(p, str):
        return [Prompt(p, None)]
    if not p:
        raise APIError(f"{field} must not be empty", 400, field)
    if all(isinstance(x, int) for x in p):
        return [Prompt(None, tuple(p))]  # type: ignore[arg-type]
    if all(isinstance(x, str) for x in p):
        return [Prompt(x, None) for x in p]  # type: ignore[arg-type]
    return [Prompt(None, tuple(x)) for x in p]  # type: ignore[arg-type]


class _Logprobs:
    """The completions API's logprobs object, built token by token for one choice."""

    def __init__(self) -> None:
        self.offset = 0

    def add_prompt(self, tokens: list[str], ids: Sequence[int], entries: PromptLogprobs) -> dict[str, list[Any]]:
        """The echoed prompt's part: its tokens, each one's logprob (the first: none) and top alternatives."""
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for text, tid, entry in zip(tokens, ids, entries):
            own = entry.get(tid) if entry else None
            out["tokens"].append(text)
            out["token_logprobs"].append(clean_logprob(own.logprob) if own else None)
            out["top_logprobs"].append(
                {(lp.decoded_token or ""): clean_logprob(lp.logprob) for lp in entry.values()} if entry else None
            )
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

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


class _Scoring:
    """What ``echo``, ``max_tokens: 0`` and ``prompt_logprobs`` ask of one request."""

    def __init__(self, ctx: ServerContext, req: CompletionRequest) -> None:
        if req.max_tokens == 0 and not req.echo:
            raise APIError("max_tokens must be at least 1; 0 only scores the prompt, with echo", 400, "max_tokens")
        self.echo, self.prompt_only = req.echo, req.max_tokens == 0
        self.tokenizer = ctx.engine.tokenizer
        # The prompt's logprobs are computed when echo shows them or the client asks for them.
        wanted = [n for n in (req.prompt_logprobs, req.logprobs if req.echo else None) if n is not None]
        self.prompt_logprobs = max(wanted) if wanted else None
        self.show_prompt_logprobs = req.prompt_logprobs is not None

    def max_tokens(self, req: CompletionRequest) -> int | None:
        return 1 if self.prompt_only else req.max_tokens

    def prefix(self, prompt: Prompt) -> str:
        if not self.echo:
            return ""
        if prompt.text is not None:
            return prompt.text
        return self.tokenizer.decode(list(prompt.ids or ()), skip_special_tokens=False)

    def prompt_tokens(self, prompt: Prompt) -> list[str]:
        return [self.tokenizer.decode([t], skip_special_tokens=False) for t in prompt.ids or ()]

    def choice_extras(self, entries: PromptLogprobs | None) -> dict[str, Any]:
        """vLLM's ``prompt_logprobs`` field of a choice: per position None or {id: logprob, rank, token}."""
        if not self.show_prompt_logprobs:
            return {}
        return {"prompt_logprobs": None if entries is None else [
            None if e is None else {str(tid): {"logprob": clean_logprob(lp.logprob), "rank": lp.rank,
                                               "decoded_token": lp.decoded_token} for tid, lp in e.items()}
            for e in entries
        ]}


async def create_completion(ctx: ServerContext, req: CompletionRequest, raw: Request) -> Response:
    model = ctx.check_model(req.model)
    scoring = _Scoring(ctx, req)
    if req.suffix:
        raise APIError("suffix is not supported", 400, "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError("best_of must equal n (beam search is not supported)", 400, "best_of")
    prepared = prepare(ctx, req, _prompts(req), scoring.max_tokens(req), req.logprobs, "prompt",
                       prompt_logprobs=scoring.prompt_logprobs)
    rid, created = new_id("cmpl"), int(time.time())  # the response's "created": this request's arrival
    stream = start(ctx, prepared, rid)
    if req.stream:
        body = guarded(stream, _stream(req, scoring, prepared, stream, rid, created, model))
        return StreamingResponse(
            body, media_type="text/event-stream", background=BackgroundTask(stream.close)
        )
    deltas = await collect(raw, stream)
    if deltas is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    return JSONResponse(_full(req, scoring, prepared, deltas, rid, created, model))


def _full(
    req: CompletionRequest,
    scoring: _Scoring,
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
    prompt_lps: list[PromptLogprobs | None] = [None] * n
    for d in deltas:
        check_delta(d)
        if d.prompt_logprobs is not None:
            prompt_lps[d.index] = d.prompt_logprobs
            if scoring.echo and req.logprobs is not None:
                prompt = prepared.prompts[d.index // req.n]
                _merge(lp_docs[d.index], lps[d.index].add_prompt(scoring.prompt_tokens(prompt), prompt.ids or (),
                                                                 d.prompt_logprobs))
        if scoring.prompt_only:
            pass  # the one computed token is dropped
        else:
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
                "text": scoring.prefix(prepared.prompts[i // req.n]) + texts[i],
                "logprobs": lp_docs[i] if req.logprobs is not None else None,
                "finish_reason": last.finish_reason if last else None,
                "stop_reason": last.stop_reason if last else None,
                **scoring.choice_extras(prompt_lps[i]),
            }
        )
    completion = 0 if scoring.prompt_only else sum(d.num_output_tokens for d in final if d is not None)
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prepared.num_prompt_tokens, completion),
    }


async def _stream(
    req: CompletionRequest,
    scoring: _Scoring,
    prepared: Prepared,
    stream: RequestStream,
    rid: str,
    created: int,
    model: str,
) -> AsyncIterator[str]:
    n = len(prepared.params) * req.n
    lps = [_Logprobs() for _ in range(n)]
    produced = [0] * n
    echoed = [False] * n  # the prompt went out in front of this choice's first chunk
    head = {"id": rid, "object": "text_completion", "created": created, "model": model}
    async for d in stream.deltas():
        check_delta(d)
        i = d.index
        produced[i] = 0 if scoring.prompt_only else d.num_output_tokens
        # The echoed prompt waits for its logprobs when they are shown (they come with the prefill's end).
        ready = not (scoring.echo and req.logprobs is not None) or d.prompt_logprobs is not None
        prefix, lp_doc, extras = "", {}, {}
        if scoring.echo and not echoed[i] and ready:
            prompt = prepared.prompts[i // req.n]
            prefix, echoed[i] = scoring.prefix(prompt), True
            if req.logprobs is not None:
                _merge(lp_doc, lps[i].add_prompt(scoring.prompt_tokens(prompt), prompt.ids or (),
                                                 d.prompt_logprobs or []))
        if d.prompt_logprobs is not None:
            extras = scoring.choice_extras(d.prompt_logprobs)
        text = "" if scoring.prompt_only else d.text
        if req.logprobs is not None and not scoring.prompt_only:
            _merge(lp_doc, lps[i].add(d))
        if not (prefix or text or extras) and d.finish_reason is None and (req.logprobs is None or not lp_doc):
            continue  # text held back (a possible stop string), or the prompt not ready: nothing to send yet
        chunk: dict[str, Any] = {
            **head,
            "choices": [
                {
                    "index": i,
                    "text": prefix + text,
                    "logprobs": (lp_doc or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []})
                    if req.logprobs is not None else None,
                    "finish_reason": d.finish_reason,
                    "stop_reason": d.stop_reason,
                    **extras,
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
