"""``/openapi.json`` as the server really answers: FastAPI documents request-validation failures as 422 with
its own error shape, but tandem answers 400 with OpenAI's ``{"error": {message, type, param, code}}`` — so every
operation documents 400 (and 404 for an unknown model, 503 while the engine is down) with that shape;
``/metrics`` returns Prometheus text, ``/health`` and ``/ping`` an empty 200, and the completion routes JSON or
(``"stream": true``) server-sent events. benchmarks/clients/schemathesis_server.py checks the server against it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "code": {"type": "integer"}}}},
}
_ERRORS = {"400": "Invalid request (the param names the field)", "404": "Unknown model",
           "503": "The engine is not running"}


def install_openapi(app: FastAPI) -> None:
    def build() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schema.setdefault("components", {}).setdefault("schemas", {})["ErrorResponse"] = ERROR_SCHEMA
        ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
        for path, ops in schema.get("paths", {}).items():
            for op in ops.values():
                responses = op.setdefault("responses", {})
                responses.pop("422", None)
                if "requestBody" in op or "parameters" in op or path.startswith("/v1/"):
                    for code, text in _ERRORS.items():
                        responses[code] = {"description": text, **ref}
        paths = schema.get("paths", {})
        metrics = paths.get("/metrics", {}).get("get")
        if metrics is not None:
            metrics["responses"]["200"] = {"description": "Prometheus text exposition",
                                           "content": {"text/plain": {"schema": {"type": "string"}}}}
        for path in ("/health", "/ping"):  # an empty 200: alive
            for op in paths.get(path, {}).values():
                op["responses"]["200"] = {"description": "The engine is running (empty body)"}
        for path in ("/v1/completions", "/v1/chat/completions"):  # "stream": true answers server-sent events
            for op in paths.get(path, {}).values():
                op["responses"]["200"] = {"description": "The completion, or its chunks as server-sent events",
                                          "content": {"application/json": {"schema": {"type": "object"}},
                                                      "text/event-stream": {"schema": {"type": "string"}}}}
        for schemas in ("HTTPValidationError", "ValidationError"):
            schema["components"]["schemas"].pop(schemas, None)
        app.openapi_schema = schema
        return schema

    app.openapi = build  # type: ignore[method-assign]
