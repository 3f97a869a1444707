"""``POST /v1/embeddings`` (a server started with ``--runner pooling``): each input's pooled final hidden state
(``--pooler-config``: LAST or MEAN, normalized by default), as floats or OpenAI's base64 of little-endian float32."""

from __future__ import annotations

import base64
import struct
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tandem.engine.prompts import Prompt
from tandem.entrypoints.openai.errors import APIError
from tandem.entrypoints.openai.protocol import MAX_CHOICES, EmbeddingRequest
from tandem.entrypoints.openai.serving_common import Prepared, ServerContext, check_delta, collect, new_id, start
from tandem.entrypoints.openai.serving_completions import prompts_of
from tandem.sampling_params import POOLING_PARAMS


async def create_embedding(ctx: ServerContext, req: EmbeddingRequest, raw: Request) -> Response:
    model = ctx.check_model(req.model)
    if not ctx.engine.config.model.pooling:
        raise APIError("this model is served for generation; start the server with --runner pooling for "
                       "/v1/embeddings", 400, "model")
    if req.dimensions is not None:
        raise APIError("dimensions is not supported: embeddings have the model's hidden size", 400, "dimensions")
    prompts = prompts_of(req.input, "input")
    if len(prompts) > MAX_CHOICES:
        raise APIError(f"at most {MAX_CHOICES} inputs per request", 400, "input")
    checked = []
    for prompt in prompts:
        try:
            ids = ctx.engine.factory.prompt_ids(prompt)
        except ValueError as exc:
            raise APIError(str(exc), 400, "input") from exc
        except (TypeError, UnicodeError) as exc:
            raise APIError(f"the input cannot be tokenized: {exc}", 400, "input") from exc
        checked.append(Prompt(prompt.text, tuple(ids)))
    prepared = Prepared(checked, [POOLING_PARAMS] * len(checked))
    rid, created = new_id("embd"), int(time.time())
    deltas = await collect(raw, start(ctx, prepared, rid))
    if deltas is None:
        return Response(status_code=499)
    vectors: list[list[float] | None] = [None] * len(checked)
    for d in deltas:
        check_delta(d)
        if d.pooled is not None:
            vectors[d.index] = d.pooled
    data: list[dict[str, Any]] = []
    for i, vec in enumerate(vectors):
        assert vec is not None, f"input {i} finished without its embedding"
        out: Any = vec
        if req.encoding_format == "base64":
            out = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": out})
    n = prepared.num_prompt_tokens
    return JSONResponse({"id": rid, "object": "list", "created": created, "model": model, "data": data,
                         "usage": {"prompt_tokens": n, "total_tokens": n}})
