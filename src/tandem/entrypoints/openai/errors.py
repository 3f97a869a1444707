"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` for every failure.

Bad input of any kind (malformed JSON, wrong types, out-of-range values, a prompt that does not
fit) is a 400; an unknown model a 404; a missing or wrong API key a 401. A 500 means a bug in
tandem, a 503 a dead engine. FastAPI's own 422 for body validation is turned into a 400 here.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tandem.sampling_params import SamplingParams

logger = logging.getLogger("tandem.server")

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(
                status, "BadRequestError" if status < 500 else "InternalServerError"
            ),
            "param": param,
            "code": status,
        }
    }


def error_response(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


def bad_value(exc: ValueError, default_param: str | None = None) -> APIError:
    """A ``ValueError`` from tandem's validation as a 400; its message starts with the field's name."""
    message = str(exc)
    first = message.split(" ", 1)[0].strip(":,")
    param = first if first in _SAMPLING_FIELDS else default_param
    return APIError(message, 400, param)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON: {first.get('msg', '')}", None
    where = ".".join(loc)
    param = loc[0] if loc else None
    more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    return f"{where or 'body'}: {first.get('msg', 'invalid value')}{more}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.message, exc.status, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(message, 400, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(str(exc.detail), exc.status_code),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error while serving a request")
        return error_response(f"internal error: {exc!r}", 500)
