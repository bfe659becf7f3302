"""Errors as RFC 9457 problem documents (application/problem+json), and their status codes."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from hongbao.api.headers import SECURITY_HEADER_TEXT
from hongbao.errors import (
    AuthError,
    Forbidden,
    HongbaoError,
    IdempotencyConflict,
    InsufficientBalance,
    InvalidRequest,
    NotFound,
    NotStarted,
    PacketCancelled,
    PacketExhausted,
    PacketExpired,
    PacketNotFound,
    RateLimited,
    RetryLater,
    StorageError,
    WithdrawalClosed,
)

log = logging.getLogger("hongbao.api")

PROBLEM_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:hongbao:problem:"

#: domain error -> HTTP status (the most specific class listed first wins)
STATUS: list[tuple[type[HongbaoError], int]] = [
    (AuthError, 401),
    (Forbidden, 403),
    (InvalidRequest, 422),
    (PacketNotFound, 404),
    (NotFound, 404),
    (PacketExhausted, 410),
    (PacketExpired, 410),
    (PacketCancelled, 410),
    (NotStarted, 409),
    (InsufficientBalance, 409),
    (IdempotencyConflict, 409),
    (WithdrawalClosed, 409),
    (RateLimited, 429),
    (StorageError, 503),
]

#: codes of HTTP-level errors raised by the routing and body handling
HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    500: "internal_error",
}


class ApiError(Exception):
    """A refusal of the HTTP request itself (413, 415, ...), before any domain code runs."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.field, self.headers = field, headers


def problem(
    status: int,
    code: str,
    detail: str,
    *,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    body: dict[str, Any] = {
        "type": TYPE_PREFIX + code,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if field is not None:
        body["field"] = field
    # the security headers ride here too: a 500 from Starlette's outermost error
    # middleware, and the grab fast path's refusals, pass no middleware that adds them
    return Response(
        json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
        status_code=status,
        headers={**SECURITY_HEADER_TEXT, **(headers or {})},
        media_type=PROBLEM_TYPE,
    )


def status_of(exc: HongbaoError) -> int:
    for kind, status in STATUS:
        if isinstance(exc, kind):
            return status
    return 500


def domain_problem(exc: HongbaoError) -> Response:
    status = status_of(exc)
    headers: dict[str, str] | None = None
    if isinstance(exc, AuthError):
        headers = {"WWW-Authenticate": 'Bearer realm="hongbao"'}
    elif isinstance(exc, RetryLater):
        headers = {"Retry-After": exc.retry_after_header}
    elif status == 503:
        headers = {"Retry-After": "1"}
        log.warning("storage unavailable: %s", exc)
    elif status == 500:
        log.error("unmapped error %s: %s", type(exc).__name__, exc)
        return problem(500, "internal_error", "internal error")
    detail = str(exc) if status != 503 else "a backing store is unavailable; retry shortly"
    field = getattr(exc, "field", None) if status == 422 else None
    if status == 422 and field is None:
        field = "body"
    return problem(status, exc.code, detail, field=field, headers=headers)


# -- Starlette exception handlers ---------------------------------------------------------------


def error_response(exc: HongbaoError | ApiError) -> Response:
    """The problem document of a refusal: the one way errors are rendered, by the routed
    endpoints (through the exception handlers) and by the grab's fast path alike."""
    if isinstance(exc, ApiError):
        return problem(exc.status, exc.code, exc.detail, field=exc.field, headers=exc.headers)
    return domain_problem(exc)


async def on_refusal(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HongbaoError | ApiError)
    return error_response(exc)


async def on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = HTTP_CODES.get(exc.status_code, "http_error")
    detail = (
        exc.detail if exc.detail != HTTPStatus(exc.status_code).phrase else _detail(exc, request)
    )
    return problem(exc.status_code, code, detail, headers=exc.headers)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem(500, "internal_error", "internal error")


def _detail(exc: HTTPException, request: Request) -> str:
    if exc.status_code == 404:
        return f"no route for {shorten(request.url.path)}"
    if exc.status_code == 405:
        return f"{request.method} is not allowed on {shorten(request.url.path)}"
    return str(exc.detail)


def shorten(text: str, most: int = 80) -> str:
    """Text from a request, cut short for a message."""
    return text if len(text) <= most else text[:most] + "…"


EXCEPTION_HANDLERS = {
    HongbaoError: on_refusal,
    ApiError: on_refusal,
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}
