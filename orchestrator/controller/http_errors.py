"""The one place errors become HTTP responses.

Every ``OrchestratorError`` maps to a status code by its class; backend failures that escape
the repository (Postgres or Redis unreachable) are translated to ``ServiceError`` first, so a
client sees 503 with a sentence instead of a stack trace. The body is always
``{"detail": <message>, "code": <stable code>}``, plus ``known`` (valid names) for a
``NotFound`` and ``problems`` (every issue) for an ``InvalidRequest``.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import redis
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from orchestrator.db.engine import disk_full, postgres_failed
from orchestrator.errors import (
    BadHost,
    ConfigError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    OrchestratorError,
    Overloaded,
    RequestTooLarge,
    ServiceError,
    StorageError,
    Unauthenticated,
    UnsupportedType,
)

__all__ = ["error_response", "install_error_handler", "status_for", "translate"]

log = logging.getLogger(__name__)

# First match in the class's MRO wins, so a subclass may be given its own code.
STATUS_BY_ERROR: Final[dict[type[OrchestratorError], int]] = {
    BadHost: 400,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    RequestTooLarge: 413,
    UnsupportedType: 415,
    InvalidRequest: 422,
    Overloaded: 429,
    ServiceError: 503,
    StorageError: 503,  # S3 did not answer, or refused what the API asked of it
    ConfigError: 500,
}

# Backend errors meaning "the service is not answering", not "our query is wrong".
_UNAVAILABLE: Final = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,
    redis.ConnectionError,
    redis.TimeoutError,
)


def translate(exc: Exception) -> OrchestratorError | None:
    """``exc`` as an ``OrchestratorError``, or ``None`` when it is a bug (a 500)."""
    if isinstance(exc, OrchestratorError):
        return exc
    if isinstance(exc, sa_exc.OperationalError) and disk_full(exc):
        return postgres_failed(exc, "postgres failed")
    if isinstance(exc, _UNAVAILABLE):
        service = "redis" if isinstance(exc, redis.RedisError) else "postgres"
        return ServiceError(
            f"{service} is unavailable ({type(exc).__name__}); try again shortly",
            service=service,
        )
    return None


def status_for(exc: OrchestratorError) -> int:
    """The HTTP status of an orchestrator error (500 for a class with no mapping)."""
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return 500


def error_response(exc: OrchestratorError) -> JSONResponse:
    """The JSON response for ``exc``."""
    body: dict[str, Any] = {"detail": str(exc), "code": exc.code}
    if isinstance(exc, NotFound) and exc.known:
        body["known"] = exc.known
    if isinstance(exc, InvalidRequest) and exc.problems:
        body["problems"] = exc.problems
    headers: dict[str, str] | None = None
    if isinstance(exc, Unauthenticated):  # RFC 6750: a 401 names the scheme to use
        headers = {"WWW-Authenticate": "Bearer"}
    elif isinstance(exc, Overloaded):  # RFC 9110: when to send the request again
        headers = {"Retry-After": str(exc.retry_after_s)}
    return JSONResponse(body, status_code=status_for(exc), headers=headers)


async def _handle(request: Request, exc: Exception) -> JSONResponse:
    translated = translate(exc)
    if translated is None:  # not ours to explain: let Starlette answer 500 and log it
        raise exc
    status = status_for(translated)
    if status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
    return error_response(translated)


# Starlette's own refusals (a multipart body it cannot parse, an unknown path or method), by
# status, in the same body as ours.
_HTTP_CODES: Final = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if not isinstance(exc.detail, str):
        return await http_exception_handler(request, exc)
    body = {"detail": exc.detail, "code": _HTTP_CODES.get(exc.status_code, "http_error")}
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": ", ".join(_methods_at(request))}
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


_METHODS: Final = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _methods_at(request: Request) -> list[str]:
    """Every method some route serves at the request's path, asked of the router itself.
    *Why:* each method of a path is a route of its own, and Starlette's 405 names only the
    first route it tried (``Allow: POST`` for a path that answers GET too)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    ]


def install_error_handler(app: FastAPI) -> None:
    """Route every orchestrator and backend-unavailable error through one handler, and give
    Starlette's own refusals the same ``{detail, code}`` body."""
    for cls in (OrchestratorError, *_UNAVAILABLE):
        app.add_exception_handler(cls, _handle)
    app.add_exception_handler(StarletteHTTPException, _http)
