"""The FastAPI app: a thin layer over ``AsyncLLM``.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models`` and
``/v1/models/{id}``, ``POST /tokenize`` and ``/detokenize``, ``GET|HEAD /health``, ``GET|POST /ping``,
``GET /version``, ``GET /metrics``. With an API key, every ``/v1`` route needs
``Authorization: Bearer <key>`` (compared in constant time); the operational routes stay open, as in
vLLM. The check is a plain ASGI middleware so it never touches the body or the disconnect signal.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

import tandem
from tandem.engine.async_llm import AsyncLLM
from tandem.engine.llm import EngineDeadError
from tandem.entrypoints.openai.errors import APIError, error_body, install_error_handlers
from tandem.entrypoints.openai.openapi import install_openapi
from tandem.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
)
from tandem.entrypoints.openai.serving_chat import create_chat_completion
from tandem.entrypoints.openai.tool_parsers import ToolParser
from tandem.entrypoints.openai.serving_common import ServerContext
from tandem.entrypoints.openai.serving_completions import create_completion
from tandem.entrypoints.openai.serving_embeddings import create_embedding
from tandem.entrypoints.openai.serving_tokens import detokenize, tokenize
from tandem.entrypoints.prom_metrics import CONTENT_TYPE, ServerMetrics


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1"):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self._expected):
            await self.app(scope, receive, send)
            return
        body = json.dumps(error_body("missing or invalid API key", 401)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def build_app(
    engine: AsyncLLM,
    served_model_names: list[str] | None = None,
    api_key: str | None = None,
    tool_parser: ToolParser | None = None,
    cors: dict[str, Any] | None = None,
) -> FastAPI:
    model_path = engine.config.model.model
    ctx = ServerContext(engine, served_model_names or [model_path], model_path, tool_parser=tool_parser)
    metrics = ServerMetrics(engine, ctx.model_name)
    app = FastAPI(title="tandem", version=tandem.__version__)
    app.state.ctx = ctx
    app.state.metrics = metrics
    install_error_handlers(app)
    install_openapi(app)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    if cors is not None:  # vLLM's --allowed-origins & co.; off unless origins are given. Added last: outermost,
        app.add_middleware(CORSMiddleware, **cors)  # so a browser's preflight is answered before the key check

    def alive() -> None:
        if not engine.healthy:
            raise APIError(f"the engine is not running: {engine.dead}", 503)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        if not engine.healthy:
            return JSONResponse(error_body(f"engine dead: {engine.dead}", 503), status_code=503)
        return Response(status_code=200)

    @app.api_route("/ping", methods=["GET", "POST"])  # vLLM's (SageMaker's) liveness route
    async def ping() -> Response:
        return await health()

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": tandem.__version__}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    def card(name: str) -> dict[str, object]:
        return {
            "id": name,
            "object": "model",
            "created": ctx.created,
            "owned_by": "tandem",
            "root": model_path,
            "parent": None,
            "max_model_len": engine.max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [card(name) for name in ctx.served_model_names]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, object]:
        return card(ctx.check_model(model_id))

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest) -> dict[str, object]:
        return tokenize(ctx, body)

    @app.post("/detokenize")
    async def detokenize_route(body: DetokenizeRequest) -> dict[str, object]:
        return detokenize(ctx, body)

    def generative() -> None:
        if engine.config.model.pooling:
            raise APIError("this model is served as a pooling model (--runner pooling): use /v1/embeddings", 400,
                           "model")

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, raw: Request) -> Response:
        alive()
        try:
            return await create_embedding(ctx, body, raw)
        except EngineDeadError as exc:
            raise APIError(str(exc), 503) from exc

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        alive()
        generative()
        try:
            return await create_completion(ctx, body, raw)
        except EngineDeadError as exc:
            raise APIError(str(exc), 503) from exc

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        alive()
        generative()
        try:
            return await create_chat_completion(ctx, body, raw)
        except EngineDeadError as exc:
            raise APIError(str(exc), 503) from exc

    return app
