"""The endpoints. Each checks the bearer token, reads and validates its input, calls the service.

Order of checks for a /v1 call: token (401), permission (403), path parameters,
body size (413), content type and JSON syntax (415), body fields (422).

A token with the hongbao:service role acts for the user named in X-On-Behalf-Of (see
`hongbao.identity.gate.acting_for`); the ledger records the service as the actor.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hongbao.api.errors import ApiError, error_response, problem
from hongbao.api.headers import SECURITY_HEADER_TEXT
from hongbao.api.schemas import (
    DepositRequest,
    GrabRequest,
    SendRequest,
    claims_json,
    claims_position,
    grab_json,
    iso,
    packet_json,
    wallet_json,
)
from hongbao.domain.ids import valid_user_id
from hongbao.domain.models import Packet
from hongbao.domain.moments import from_ms
from hongbao.domain.rules import parse_time
from hongbao.errors import (
    AuthError,
    Forbidden,
    HongbaoError,
    InvalidRequest,
    NotInAudience,
    NotStarted,
    PacketCancelled,
    PacketExhausted,
    PacketExpired,
    PacketNotFound,
    RateLimited,
    StorageError,
    TooManyAttempts,
    WrongPassphrase,
)
from hongbao.identity.gate import Identity
from hongbao.identity.principal import Principal
from hongbao.metrics import CONTENT_TYPE, Metrics
from hongbao.runtime import Runtime
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage.redis import NO_EVICTION

M = TypeVar("M", bound=BaseModel)

MAX_BODY = 16 * 1024
#: claims per page of GET /v1/packets/{id}/claims: by default, and at most
DEFAULT_CLAIMS_PAGE = 100
MAX_CLAIMS_PAGE = 1_000
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,128}$"
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
PING_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class GrabBody:
    """A grab request's body as received, checked only once the caller is known."""

    #: the Content-Type header ("" when absent)
    content_type: str
    #: the bytes, None when they passed MAX_BODY (the rest was not read)
    data: bytes | None


def has_body(content_length: str | None, transfer_encoding: str | None) -> bool:
    """Whether a request's headers announce a body (a grab usually has none): a length of
    zero written with more digits (``00``) announces none either. A chunked body may
    still turn out empty; the grab then treats it as none (`grab_body`)."""
    if transfer_encoding is not None:
        return True
    return content_length is not None and content_length.strip().lstrip("0") != ""


def grab_body(content_type: str | None, data: bytes | None) -> GrabBody | None:
    """A grab's body as read: None when it is empty (an empty chunked body, say), which
    is a grab without a body like one with ``Content-Length: 0``."""
    if data == b"":
        return None
    return GrabBody(content_type or "", data)


class Api:
    """The endpoints of one app; `runtime` is set by the app's lifespan."""

    def __init__(self, settings: Settings, identity: Identity, metrics: Metrics) -> None:
        self.settings = settings
        self.identity = identity
        self.metrics = metrics
        self.runtime: Runtime | None = None
        self.openapi: bytes = b"{}"

    @property
    def service(self) -> Hongbao:
        if self.runtime is None:
            raise StorageError("the service is not started")
        return self.runtime.service

    def routes(self, *, metrics: bool = True) -> list[Route]:
        """The API's routes; `metrics` False leaves /metrics to a listener of its own."""
        routes = [
            # the hot path first: a request is matched against the routes in order
            Route("/v1/packets/{packet_id}/grab", self.grab, methods=["POST"]),
            Route("/v1/wallets/{user_id}/deposits", self.deposit, methods=["POST"]),
            Route("/v1/wallets/{user_id}", self.wallet, methods=["GET"]),
            Route("/v1/packets", self.send, methods=["POST"]),
            Route("/v1/packets/{packet_id}", self.packet, methods=["GET"]),
            Route("/v1/packets/{packet_id}/claims", self.claims, methods=["GET"]),
            Route("/v1/packets/{packet_id}/cancel", self.cancel, methods=["POST"]),
            Route("/v1/admin/users/{user_id}/revoke-tokens", self.revoke_tokens, methods=["POST"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/openapi.json", self.openapi_json, methods=["GET"]),
        ]
        if metrics:
            routes.append(Route("/metrics", self.metrics_text, methods=["GET"]))
        return routes

    # -- /v1 ----------------------------------------------------------------------------------

    async def caller(self, request: Request) -> Principal:
        """The verified caller of a request (AuthError 401, Forbidden 403 if refused)."""
        headers = request.headers
        return await self.identity.authenticate(
            headers.get("authorization"), headers.get("x-on-behalf-of")
        )

    async def deposit(self, request: Request) -> Response:
        caller = await self.caller(request)
        if not caller.admin:
            raise Forbidden("only an admin may deposit")
        user_id = _user_id(request)
        key = _idempotency_key(request)
        body = await read_json(request, DepositRequest)
        wallet = await self.service.deposit(
            user_id, body.amount, reference=key, actor=caller.user_id
        )
        return JSONResponse(wallet_json(wallet), status_code=201)

    async def revoke_tokens(self, request: Request) -> Response:
        """Refuse every token of a user issued until now, in every API process."""
        caller = await self.caller(request)
        if not caller.admin:
            raise Forbidden("only an admin may revoke tokens")
        user_id = _user_id(request)
        until = await self.identity.revoke(user_id)
        return JSONResponse({"user_id": user_id, "revoked_until": iso(from_ms(until * 1000))})

    async def wallet(self, request: Request) -> Response:
        caller = await self.caller(request)
        user_id: str = request.path_params["user_id"]
        if caller.user_id != user_id and not caller.admin:
            raise Forbidden("a wallet can be read by its owner or an admin")
        wallet = await self.service.wallet(_user_id(request))
        return JSONResponse(wallet_json(wallet))

    async def send(self, request: Request) -> Response:
        caller = await self.caller(request)
        # a service's calls all come from its own address: only its users are limited
        ip = _client_ip(request) if caller.actor is None else None
        await self.limit(ip, "send", caller.user_id)
        key = _idempotency_key(request)
        body = await read_json(request, SendRequest)
        starts_at = None if body.starts_at is None else parse_time(body.starts_at, "starts_at")
        packet = await self.service.send(
            caller.user_id,
            body.total_amount,
            body.count,
            body.mode,
            body.greeting,
            body.expires_in if "expires_in" in body.model_fields_set else None,
            idempotency_key=key,
            actor=caller.actor,
            audience=body.audience,
            passphrase=body.passphrase,
            starts_at=starts_at,
        )
        return JSONResponse(await self._packet_json(packet, caller), status_code=201)

    async def packet(self, request: Request) -> Response:
        caller = await self.caller(request)
        packet = await self.service.packet(request.path_params["packet_id"])
        return JSONResponse(await self._packet_json(packet, caller))

    async def cancel(self, request: Request) -> Response:
        """Close the packet now and refund what is left (its sender or an admin)."""
        caller = await self.caller(request)
        packet = await self.service.cancel(
            request.path_params["packet_id"], caller.user_id, admin=caller.admin
        )
        return JSONResponse(await self._packet_json(packet, caller))

    async def _packet_json(self, packet: Packet, caller: Principal) -> dict[str, Any]:
        """The packet's JSON: with an audience, whether it names the caller, and its users
        for its sender and admins."""
        if not packet.audience_size:
            return packet_json(packet)
        audience = None
        if caller.user_id == packet.sender_id or caller.admin:
            audience = await self.service.audience(packet.id)
            for_you = caller.user_id in audience
        else:
            for_you = await self.service.in_audience(packet.id, caller.user_id)
        return {**packet_json(packet, audience), "for_you": for_you}

    async def grab(self, request: Request) -> Response:
        """The route; `GrabFastPath` answers these requests before routing (same code below)."""
        headers = request.headers
        body = None
        if has_body(headers.get("content-length"), headers.get("transfer-encoding")):
            chunks: list[bytes] = []
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY:
                    break
                chunks.append(chunk)
            data = b"".join(chunks) if size <= MAX_BODY else None
            body = grab_body(headers.get("content-type"), data)
        answer = await self.grab_answer(
            request.path_params["packet_id"],
            headers.get("authorization"),
            _client_ip(request),
            headers.get("x-on-behalf-of"),
            body,
        )
        if isinstance(answer, Response):
            return answer
        # the headers the fast path's answer carries, in its order
        return Response(answer, media_type="application/json", headers=SECURITY_HEADER_TEXT)

    async def grab_answer(
        self,
        packet_id: str,
        authorization: str | None,
        client_ip: str | None,
        on_behalf_of: str | None = None,
        body: GrabBody | None = None,
    ) -> bytes | Response:
        """The hot path: a token check (a cache lookup for a token seen before) and one
        Redis script; no SQL on success. `body`, when the request has one, may carry the
        packet's passphrase.

        A grab's answer is the JSON body of its 200 response; a refusal, the whole
        problem response (the fast path writes a 200 without a Response object)."""
        started = time.perf_counter()
        try:
            caller = await self.identity.authenticate(authorization, on_behalf_of)
            actor = caller.actor
            await self.limit(client_ip if actor is None else None, "grab", caller.user_id)
            passphrase = None if body is None else grab_passphrase(body)
            result = await self.service.grab(packet_id, caller.user_id, actor, passphrase)
        except (HongbaoError, ApiError) as exc:
            self.metrics.grabs.record(_outcome(exc), time.perf_counter() - started)
            return error_response(exc)
        outcome = "granted" if result.first else "repeat"
        self.metrics.grabs.record(outcome, time.perf_counter() - started)
        return orjson.dumps(grab_json(result))

    async def claims(self, request: Request) -> Response:
        await self.caller(request)
        limit = query_int(request, "limit", DEFAULT_CLAIMS_PAGE, 1, MAX_CLAIMS_PAGE)
        cursor = request.query_params.get("cursor")
        claims = await self.service.claims(
            request.path_params["packet_id"],
            limit=limit,
            after=claims_position(cursor) if cursor else None,
        )
        return JSONResponse(claims_json(claims))

    async def limit(self, ip: str | None, action: str, user_id: str) -> None:
        """RateLimited (429 with Retry-After) when the user or the client IP is over its rate."""
        limiter = self.service.limiter
        if limiter.enabled:
            await limiter.check(action, user_id, ip)

    # -- operations ---------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        runtime = self.runtime
        if runtime is None:
            return problem(503, "not_ready", "the service is starting or stopping")
        redis_ok, db_ok = await asyncio.gather(
            _ping(runtime.service.store.ping()), _ping(runtime.service.ledger.ping())
        )
        down = [name for name, ok in (("redis", redis_ok), ("database", db_ok)) if not ok]
        if down:
            return problem(
                503,
                "storage_unavailable",
                f"unreachable: {', '.join(down)}",
                headers={"Retry-After": "1"},
            )
        policy = await _eviction_policy(runtime.service)
        if policy not in (None, NO_EVICTION) and not self.settings.allow_eviction:
            return problem(
                503,
                "redis_may_evict",
                f"redis maxmemory-policy is {policy}: it may drop packets; set {NO_EVICTION}",
            )
        if not runtime.workers_alive():
            return problem(503, "not_ready", "the persister or sweeper stopped unexpectedly")
        return JSONResponse({"status": "ready"})

    async def metrics_text(self, request: Request) -> Response:
        if self.runtime is not None:
            await self.metrics.refresh(self.runtime.service.store)
            await self.metrics.withdrawals.refresh(self.runtime.service.withdrawals)
            await self.metrics.refresh_webhooks(self.runtime.service.ledger)
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def openapi_json(self, request: Request) -> Response:
        return Response(self.openapi, media_type="application/json")


# -- input ------------------------------------------------------------------------------------


Handler = Callable[[Request], Awaitable[Response]]


def route_by_method(path: str, handlers: Mapping[str, Handler]) -> Route:
    """One route for a path whose methods have handlers of their own: a method it lacks
    answers 405 with an Allow header naming every method the path has (separate routes
    per method would each name only their own). HEAD, which Starlette allows wherever GET
    is, runs the GET handler, as on every other GET route (the server sends no body)."""
    by_method = dict(handlers)
    if "GET" in by_method:
        by_method.setdefault("HEAD", by_method["GET"])

    async def endpoint(request: Request) -> Response:
        return await by_method[request.method](request)

    return Route(path, endpoint, methods=list(handlers))


def _user_id(request: Request) -> str:
    user_id: str = request.path_params["user_id"]
    if not valid_user_id(user_id):
        raise InvalidRequest(
            "user_id must be 1-64 characters of letters, digits and _ . : @ -", "user_id"
        )
    return user_id


def grab_passphrase(body: GrabBody) -> str | None:
    """The passphrase a grab's body carries (None for none): 413 over 16 KiB, 415 unless
    JSON, 400 for malformed JSON, 422 for any other field or a passphrase too long."""
    if body.data is None:
        raise _too_large()
    _require_json(body.content_type)
    grab = _validated(GrabRequest, parse_json(body.data))
    return grab.passphrase


def _require_json(content_type: str) -> None:
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        raise ApiError(415, "unsupported_media_type", "the body must be application/json")


def _validated(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        field, detail = _describe(error)
        raise InvalidRequest(detail, field) from None


async def read_json(request: Request, model: type[M]) -> M:
    """The body as `model`: 413 over 16 KiB, 415 unless JSON, 422 naming the bad field."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY:
        raise _too_large()
    _require_json(request.headers.get("content-type", ""))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise _too_large()
        chunks.append(chunk)
    return _validated(model, parse_json(b"".join(chunks)))


def parse_json(body: bytes) -> Any:
    """The JSON value of a body; 400 `malformed_json` saying what is wrong with it."""
    try:
        return json.loads(body)
    except RecursionError:
        reason = "it nests too deep"
    except UnicodeDecodeError:
        reason = "it is not UTF-8 text"
    except json.JSONDecodeError as exc:
        reason = str(exc)
    except ValueError as exc:  # an integer of more digits than Python converts
        reason = f"a number is too long ({exc})"
    raise ApiError(400, "malformed_json", f"the body is not valid JSON: {reason}")


def _too_large() -> ApiError:
    return ApiError(413, "payload_too_large", f"the body must be at most {MAX_BODY} bytes")


def _describe(error: ErrorDetails) -> tuple[str, str]:
    """The field and a sentence for the first thing wrong in a body."""
    # an item of a list is named by the list ("audience", not "audience.3")
    field = ".".join(str(part) for part in error["loc"] if not isinstance(part, int)) or "body"
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return field, f"{field} is required"
    if kind == "extra_forbidden":
        return field, f"unknown field {field}"
    if kind == "model_type":
        return field, "the body must be a JSON object"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return field, f"{field} must be an integer"
    if kind in ("string_type", "string_unicode"):
        return field, f"{field} must be a string"
    if kind == "greater_than_equal":
        return field, f"{field} must be at least {ctx.get('ge')}"
    if kind == "greater_than":
        return field, f"{field} must be more than {ctx.get('gt')}"
    if kind == "less_than_equal":
        return field, f"{field} must be at most {ctx.get('le')}"
    if kind == "less_than":
        return field, f"{field} must be less than {ctx.get('lt')}"
    if kind == "string_too_long":
        return field, f"{field} must be at most {ctx.get('max_length')} characters"
    if kind == "string_too_short":
        return field, f"{field} must be at least {ctx.get('min_length')} characters"
    if kind == "too_long":
        return field, f"{field} must have at most {ctx.get('max_length')} items"
    if kind == "too_short":
        return field, f"{field} must have at least {ctx.get('min_length')} item"
    if kind == "list_type":
        return field, f"{field} must be a list"
    if kind == "literal_error":
        return field, f"{field} must be one of {ctx.get('expected')}"
    if kind == "string_pattern_mismatch":
        return field, PATTERN_SENTENCES.get(field, f"{field} has characters that are not allowed")
    return field, f"{field} is not valid"


#: what a field's pattern allows, said in words
PATTERN_SENTENCES = {
    "greeting": "greeting may not contain control or text-direction characters",
    "name": "name must be 1-64 characters of letters, digits and _ . : @ -",
    "audience": "audience must list user ids of 1-64 letters, digits and _ . : @ -",
    "starts_at": "starts_at must be an RFC 3339 time with its offset",
}


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high]; 422 naming it otherwise."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    # a value longer than any in range with a few leading zeros is refused before int(),
    # which counts the zeros toward Python's 4,300-digit limit; more digits than `high`
    # has after the zeros is out of range
    if (
        not raw.isascii()
        or not raw.isdigit()
        or len(raw) > len(str(high)) + 16
        or len(raw.lstrip("0")) > len(str(high))
        or not low <= int(raw) <= high
    ):
        raise InvalidRequest(f"{name} must be a whole number from {low} to {high}", name)
    return int(raw)


def _client_ip(request: Request) -> str | None:
    return request.client.host if request.client else None


def _outcome(exc: HongbaoError | ApiError) -> str:
    if isinstance(exc, ApiError):
        return "invalid"
    named = _RULE_OUTCOMES.get(type(exc))
    if named is not None:
        return named
    if isinstance(exc, PacketExhausted):
        return "exhausted"
    if isinstance(exc, PacketExpired):
        return "expired"
    if isinstance(exc, PacketNotFound):
        return "not_found"
    if isinstance(exc, AuthError | Forbidden):
        return "unauthorized"
    if isinstance(exc, RateLimited):
        return "rate_limited"
    if isinstance(exc, InvalidRequest):
        return "invalid"
    return "error"


#: grabs the packet's rules turned away, by outcome label
_RULE_OUTCOMES: dict[type[HongbaoError], str] = {
    NotInAudience: "not_in_audience",
    WrongPassphrase: "wrong_passphrase",
    TooManyAttempts: "too_many_attempts",
    NotStarted: "not_started",
    PacketCancelled: "cancelled",
}


async def _ping(check: Any) -> bool:
    try:
        return bool(await asyncio.wait_for(check, PING_TIMEOUT))
    except (TimeoutError, StorageError, OSError):
        return False


async def _eviction_policy(service: Hongbao) -> str | None:
    """Redis's maxmemory-policy now (it can be changed at run time); None if unknown."""
    try:
        return await asyncio.wait_for(service.store.eviction_policy(), PING_TIMEOUT)
    except (TimeoutError, StorageError, OSError):
        return None


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is not None and not _IDEMPOTENCY_KEY.match(key):
        raise InvalidRequest(
            "Idempotency-Key must be 1 to 128 visible ASCII characters", "Idempotency-Key"
        )
    return key
