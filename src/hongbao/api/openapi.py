"""The OpenAPI 3.1 document, from the pydantic models and the running settings."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

import hongbao
from hongbao.api.errors import PROBLEM_TYPE
from hongbao.api.history import MODELS as HISTORY_MODELS
from hongbao.api.routes import (
    DEFAULT_CLAIMS_PAGE,
    IDEMPOTENCY_KEY_PATTERN,
    MAX_BODY,
    MAX_CLAIMS_PAGE,
)
from hongbao.api.schemas import (
    AdminStats,
    ClaimsOut,
    DemoSignIn,
    DemoTokenOut,
    DepositRequest,
    GrabOut,
    GrabRequest,
    Health,
    PacketOut,
    Problem,
    RevokedOut,
    SendRequest,
    TicketOut,
    WalletOut,
)
from hongbao.api.webhooks import MODELS as WEBHOOK_MODELS
from hongbao.api.webhooks import WebhookRequest
from hongbao.api.withdrawals import MODELS as WITHDRAWAL_MODELS
from hongbao.api.withdrawals import STATES as WITHDRAWAL_STATES
from hongbao.domain.ids import PACKET_ID_PATTERN, USER_ID_PATTERN
from hongbao.domain.withdrawals import WITHDRAWAL_ID_PATTERN
from hongbao.history import DEFAULT_PAGE, MAX_PAGE, MAX_YEAR, MIN_YEAR
from hongbao.ledger.schema import ENTRY_KINDS
from hongbao.settings import Settings
from hongbao.withdrawals import DEFAULT_PAGE as DEFAULT_WITHDRAWALS_PAGE
from hongbao.withdrawals import MAX_OLDER_THAN, MAX_STATUS_PAGE
from hongbao.withdrawals import MAX_PAGE as MAX_WITHDRAWALS_PAGE

REF = "#/components/schemas/{model}"

_MODELS: list[tuple[type[BaseModel], JsonSchemaMode]] = [
    (DepositRequest, "validation"),
    (SendRequest, "validation"),
    (GrabRequest, "validation"),
    (WalletOut, "serialization"),
    (PacketOut, "serialization"),
    (GrabOut, "serialization"),
    (ClaimsOut, "serialization"),
    (Problem, "serialization"),
    (Health, "serialization"),
    (AdminStats, "serialization"),
    (DemoSignIn, "validation"),
    (DemoTokenOut, "serialization"),
    (RevokedOut, "serialization"),
    (TicketOut, "serialization"),
    *((model, "serialization") for model in HISTORY_MODELS),
    *WITHDRAWAL_MODELS,
    (WebhookRequest, "validation"),
    *((model, "serialization") for model in WEBHOOK_MODELS),
]

_ERRORS = {
    400: "the body is declared JSON but is not valid JSON (`malformed_json`)",
    401: "missing, malformed, forged, expired or revoked bearer token (`unauthorized`)",
    403: (
        "not allowed for this caller, or X-On-Behalf-Of without the service role "
        "(`forbidden`); a grab the packet's rules refuse: `not_in_audience`, "
        "`wrong_passphrase`"
    ),
    404: (
        "no such packet (`packet_not_found`), webhook endpoint (`webhook_not_found`) or "
        "route (`not_found`)"
    ),
    409: (
        "`insufficient_balance`, `idempotency_conflict` (same key, other body), or a grab "
        "before the packet's start (`not_started`; see Retry-After)"
    ),
    410: "`packet_exhausted`, `packet_expired` or `packet_cancelled`",
    413: f"body over {MAX_BODY} bytes (`payload_too_large`)",
    415: "body is not JSON (`unsupported_media_type`)",
    422: "a field is invalid (`invalid_request`; `field` names it)",
    429: (
        "too many grabs or sends from this user or address (`rate_limited`), too many "
        "wrong passphrases for this packet (`too_many_attempts`), or the sender's daily "
        "limit reached (`send_limit_reached`); see Retry-After"
    ),
    503: "Redis or the database is unreachable (`storage_unavailable`)",
}


def build_openapi(
    settings: Settings, *, demo_mode: bool = False, metrics: bool = True
) -> dict[str, Any]:
    """The document; `demo_mode` (``serve --demo``) adds ``POST /demo/token``; `metrics`
    False leaves out ``/metrics`` (served on an address of its own)."""
    _, defs = models_json_schema(_MODELS, ref_template=REF)
    schemas: dict[str, Any] = defs["$defs"]
    limits = settings.split_limits
    send = schemas["SendRequest"]["properties"]
    send["count"]["maximum"] = limits.max_count
    send["total_amount"]["maximum"] = limits.max_count * limits.max_share
    send["total_amount"]["description"] += (
        f"; from count × {limits.min_share} to count × {limits.max_share}"
    )
    send["expires_in"]["maximum"] = settings.max_expires_in
    send["expires_in"]["default"] = settings.default_expires_in

    user = _path_param("user_id", {"type": "string", "pattern": USER_ID_PATTERN})
    packet = _path_param("packet_id", {"type": "string", "pattern": PACKET_ID_PATTERN.pattern})
    idempotency = {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "description": "retrying with the same key repeats the first answer, changing nothing",
        "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN, "maxLength": 128},
    }
    claims_limit = {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": "claims in the page",
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_CLAIMS_PAGE,
            "default": DEFAULT_CLAIMS_PAGE,
        },
    }
    claims_cursor = {
        "name": "cursor",
        "in": "query",
        "required": False,
        "description": "the `next_cursor` of the previous page",
        "schema": {"type": "string"},
    }
    behalf = {
        "name": "X-On-Behalf-Of",
        "in": "header",
        "required": False,
        "description": "the user a service token (role hongbao:service) acts for",
        "schema": {"type": "string", "pattern": USER_ID_PATTERN},
    }
    paths: dict[str, Any] = {
        "/v1/wallets/{user_id}/deposits": {
            "post": _op(
                "deposit",
                "Add money to a wallet (admin only)",
                [user, idempotency],
                _body("DepositRequest"),
                201,
                "WalletOut",
                [400, 401, 403, 404, 409, 413, 415, 422, 503],
            )
        },
        "/v1/wallets/{user_id}": {
            "get": _op(
                "getWallet",
                "A wallet's balance (its owner or an admin)",
                [user, behalf],
                None,
                200,
                "WalletOut",
                [401, 403, 404, 422, 503],
            )
        },
        "/v1/packets": {
            "post": _op(
                "sendPacket",
                "Send a red packet (debits the caller)",
                [idempotency, behalf],
                _body("SendRequest"),
                201,
                "PacketOut",
                [400, 401, 403, 404, 409, 413, 415, 422, 429, 503],
            )
        },
        "/v1/packets/{packet_id}": {
            "get": _op(
                "getPacket",
                "A packet and what is left in it",
                [packet, behalf],
                None,
                200,
                "PacketOut",
                [401, 403, 404, 422, 503],
            )
        },
        "/v1/packets/{packet_id}/grab": {
            "post": _op(
                "grabPacket",
                "Take one share; the same caller again gets the same share",
                [packet, behalf],
                {**_body("GrabRequest"), "required": False},
                200,
                "GrabOut",
                [400, 401, 403, 404, 409, 410, 413, 415, 422, 429, 503],
            )
        },
        "/v1/packets/{packet_id}/cancel": {
            "post": _op(
                "cancelPacket",
                "Close the packet now and refund what is left (its sender or an admin)",
                [packet, behalf],
                None,
                200,
                "PacketOut",
                [401, 403, 404, 410, 422, 503],
            )
        },
        "/v1/packets/{packet_id}/claims": {
            "get": _op(
                "getClaims",
                "Who got what, in grab order, a page at a time",
                [packet, behalf, claims_limit, claims_cursor],
                None,
                200,
                "ClaimsOut",
                [401, 403, 404, 422, 503],
            )
        },
        "/v1/packets/{packet_id}/events": {"get": _events(packet)},
        "/v1/packets/{packet_id}/events/ticket": {
            "post": _op(
                "packetEventsTicket",
                "A ticket for the packet's event stream (?ticket=), good for a minute",
                [packet, behalf],
                None,
                200,
                "TicketOut",
                [401, 403, 404, 422, 503],
            )
        },
        "/v1/admin/users/{user_id}/revoke-tokens": {
            "post": _op(
                "revokeTokens",
                "Refuse every token of the user issued until now (admin only)",
                [user],
                None,
                200,
                "RevokedOut",
                [401, 403, 422, 503],
            )
        },
        "/admin/stats": {
            "get": _op(
                "adminStats",
                "The dashboard's numbers (admin only)",
                [],
                None,
                200,
                "AdminStats",
                [401, 403, 503],
            )
        },
        **_history_paths(user),
        **_withdrawal_paths(user, idempotency, behalf),
        **_webhook_paths(),
        "/healthz": {"get": _plain("healthz", "The process is up", {200: "Health"})},
        "/readyz": {
            "get": _plain(
                "readyz", "Redis and the database answer", {200: "Health", 503: "Problem"}
            )
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": [],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }
    if metrics:
        paths["/metrics"] = {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "security": [],
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        }
    if demo_mode:
        sign_in = _op(
            "demoToken",
            "Demo sign-in: a user token for a name; the first sign-in deposits demo money",
            [],
            _body("DemoSignIn"),
            201,
            "DemoTokenOut",
            [400, 413, 415, 422, 429, 503],
        )
        paths["/demo/token"] = {"post": {**sign_in, "security": []}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "hongbao",
            "version": hongbao.__version__,
            "description": (
                "Red packets (红包). Amounts are integers in fen. Every /v1 call needs "
                "`Authorization: Bearer <token>`: a JWT (HS256 under hongbao's secret, as "
                "`hongbao token USER` mints, or RS256 / ES256 / EdDSA under the host app's "
                "keys). Roles: hongbao:admin, hongbao:service (acts for the user named in "
                "X-On-Behalf-Of). Errors are application/problem+json with a "
                "machine-readable `code`."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _history_paths(user: dict[str, Any]) -> dict[str, Any]:
    """The red-packet record, a wallet's entries and the daily statement (api/history.py)."""

    def query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "in": "query",
            "required": False,
            "description": description,
            "schema": schema,
        }

    year = query(
        "year",
        "the UTC year (default: this year)",
        {"type": "integer", "minimum": MIN_YEAR, "maximum": MAX_YEAR},
    )
    limit = query(
        "limit",
        "rows in the page",
        {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_PAGE,
            "default": DEFAULT_PAGE,
        },
    )
    cursor = query(
        "cursor",
        "the `next_cursor` of the previous page (empty: the first page)",
        {"type": "string"},
    )
    kind = query("kind", "only entries of this kind", {"type": "string", "enum": list(ENTRY_KINDS)})
    day = _path_param("date", {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"})
    return {
        "/v1/users/{user_id}/received": {
            "get": _op(
                "getReceived",
                "Packets the user grabbed in a year, newest first, with the year's totals "
                "(the user or an admin)",
                [user, year, limit, cursor],
                None,
                200,
                "ReceivedOut",
                [401, 403, 422, 503],
            )
        },
        "/v1/users/{user_id}/sent": {
            "get": _op(
                "getSent",
                "Packets the user sent in a year, newest first, with the year's totals "
                "(the user or an admin)",
                [user, year, limit, cursor],
                None,
                200,
                "SentOut",
                [401, 403, 422, 503],
            )
        },
        "/v1/wallets/{user_id}/entries": {
            "get": _op(
                "getEntries",
                "A wallet's ledger entries, newest first, each with the balance after it "
                "(its owner or an admin)",
                [user, limit, cursor, kind],
                None,
                200,
                "EntriesOut",
                [401, 403, 422, 503],
            )
        },
        "/v1/admin/statements/{date}": {
            "get": _op(
                "getStatement",
                "Every ledger entry of a UTC day, per-kind totals and the check that the "
                "wallets at its start plus its entries make those at its end (admin only)",
                [day],
                None,
                200,
                "StatementOut",
                [401, 403, 422, 503],
            )
        },
    }


def _withdrawal_paths(
    user: dict[str, Any], idempotency: dict[str, Any], behalf: dict[str, Any]
) -> dict[str, Any]:
    """Money out of a wallet, paid by the host's payment system (api/withdrawals.py)."""
    withdrawal = _path_param(
        "withdrawal_id", {"type": "string", "pattern": WITHDRAWAL_ID_PATTERN.pattern}
    )
    key = {
        **idempotency,
        "required": True,
        "description": "the same key again answers the same withdrawal, debited once",
    }
    state: dict[str, Any] = {
        "name": "status",
        "in": "query",
        "required": False,
        "description": "only withdrawals in this state",
        "schema": {"type": "string", "enum": WITHDRAWAL_STATES},
    }
    limit: dict[str, Any] = {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": "withdrawals in the page",
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_WITHDRAWALS_PAGE,
            "default": DEFAULT_WITHDRAWALS_PAGE,
        },
    }
    cursor = {
        "name": "cursor",
        "in": "query",
        "required": False,
        "description": "the `next_cursor` of the previous page",
        "schema": {"type": "string"},
    }
    listing = [user, behalf, state, limit, cursor]
    in_status = [
        {
            **state,
            "description": "the state of the withdrawals listed",
            "schema": {**state["schema"], "default": "requested"},
        },
        {
            "name": "older_than",
            "in": "query",
            "required": False,
            "description": "only those requested at least this many seconds ago",
            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OLDER_THAN},
        },
        {**limit, "schema": {**limit["schema"], "maximum": MAX_STATUS_PAGE}},
        cursor,
    ]
    note = {**_body("OutcomeRequest"), "required": False}
    ops = {
        "/v1/wallets/{user_id}/withdrawals": {
            "post": _op(
                "requestWithdrawal",
                "Take money out of a wallet: debited at once, paid out by the host's payment "
                "system (the owner, a service for them, or an admin)",
                [user, key, behalf],
                _body("WithdrawalRequest"),
                201,
                "WithdrawalOut",
                [400, 401, 403, 409, 413, 415, 422, 503],
            ),
            "get": _op(
                "listWithdrawals",
                "A wallet's withdrawals, newest first (the owner, a service for them, or an admin)",
                listing,
                None,
                200,
                "WithdrawalsOut",
                [401, 403, 422, 503],
            ),
        },
        "/v1/withdrawals": {
            "get": _op(
                "listWithdrawalsInStatus",
                "Every user's withdrawals in one state, oldest first; by default the "
                "requested ones, whose payout is not reported yet (admin only)",
                in_status,
                None,
                200,
                "WithdrawalsInStatusOut",
                [401, 403, 422, 503],
            )
        },
        "/v1/withdrawals/{withdrawal_id}": {
            "get": _op(
                "getWithdrawal",
                "A withdrawal and its state (its owner, a service, or an admin)",
                [withdrawal, behalf],
                None,
                200,
                "WithdrawalOut",
                [401, 403, 404, 503],
            )
        },
        "/v1/withdrawals/{withdrawal_id}/complete": {
            "post": _op(
                "completeWithdrawal",
                "The payout was made (a service or an admin); again: the same answer",
                [withdrawal],
                note,
                200,
                "WithdrawalOut",
                [400, 401, 403, 404, 409, 413, 415, 422, 503],
            )
        },
        "/v1/withdrawals/{withdrawal_id}/fail": {
            "post": _op(
                "failWithdrawal",
                "The payout failed: the money goes back to the wallet, once (a service or an "
                "admin); again: the same answer",
                [withdrawal],
                note,
                200,
                "WithdrawalOut",
                [400, 401, 403, 404, 409, 413, 415, 422, 503],
            )
        },
    }
    refusals = {
        "404": "no such withdrawal (`withdrawal_not_found`)",
        "409": (
            "`insufficient_balance`, `idempotency_conflict` (same key, other amount), or "
            "the other outcome was reported before (`withdrawal_already_completed`, "
            "`withdrawal_already_failed`)"
        ),
    }
    for methods in ops.values():
        for op in methods.values():
            for status, description in refusals.items():
                if status in op["responses"]:
                    op["responses"][status] = _problem(description)
    return ops


def _webhook_paths() -> dict[str, Any]:
    """Webhook endpoints, for admins (api/webhooks.py)."""
    webhook = _path_param("webhook_id", {"type": "string", "maxLength": 32})
    deleted = {
        "operationId": "deleteWebhook",
        "summary": "Remove a webhook endpoint: nothing more is sent to it (admin only)",
        "parameters": [webhook],
        "responses": {"204": {"description": "removed"}, **_problems([401, 403, 404, 503])},
    }
    return {
        "/v1/webhooks": {
            "post": _op(
                "createWebhook",
                "Register an endpoint for some event types; the answer has its signing "
                "secret (admin only)",
                [],
                _body("WebhookRequest"),
                201,
                "WebhookOut",
                [400, 401, 403, 413, 415, 422, 503],
            ),
            "get": _op(
                "listWebhooks",
                "The webhook endpoints (admin only)",
                [],
                None,
                200,
                "WebhookListOut",
                [401, 403, 503],
            ),
        },
        "/v1/webhooks/{webhook_id}": {
            "get": _op(
                "getWebhook",
                "A webhook endpoint (admin only)",
                [webhook],
                None,
                200,
                "WebhookOut",
                [401, 403, 404, 503],
            ),
            "delete": deleted,
        },
        "/v1/webhooks/{webhook_id}/rotate-secret": {
            "post": _op(
                "rotateWebhookSecret",
                "A new signing secret; the old one signs too for 24 hours (admin only)",
                [webhook],
                None,
                200,
                "WebhookOut",
                [401, 403, 404, 503],
            )
        },
        "/v1/webhooks/{webhook_id}/enable": {
            "post": _op(
                "enableWebhook",
                "Send events to a disabled endpoint again; its parked deliveries stay parked "
                "until an operator retries them (admin only)",
                [webhook],
                None,
                200,
                "WebhookOut",
                [401, 403, 404, 503],
            )
        },
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _events(packet: dict[str, Any]) -> dict[str, Any]:
    ticket = {
        "name": "ticket",
        "in": "query",
        "required": False,
        "description": (
            "a ticket from POST .../events/ticket, for clients that cannot set headers "
            "(EventSource); a bearer token is never put in the URL"
        ),
        "schema": {"type": "string"},
    }
    data = {
        "type": "object",
        "required": ["packet", "claims"],
        "properties": {"packet": _ref("PacketOut"), "claims": _ref("ClaimsOut")},
    }
    # OpenAPI 3.1 has no itemSchema (3.2): the schema of a text/event-stream is that of
    # one event, as the HTML standard's fields (what schemathesis checks each event with)
    event = {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"const": "packet"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": data,
            },
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    }
    stream = {
        "description": "an event stream; it ends after a while and the client reconnects",
        "content": {"text/event-stream": {"schema": event}},
    }
    return {
        "operationId": "packetEvents",
        "summary": "Server-Sent Events: a `packet` event ({packet, claims}) now and on changes",
        "parameters": [packet, ticket],
        "responses": {"200": stream, **_problems([401, 404, 503])},
    }


def _path_param(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _body(model: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(model)}}}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {PROBLEM_TYPE: {"schema": _ref("Problem")}}}


def _problems(codes: list[int]) -> dict[str, Any]:
    """The documented problem+json answers for these statuses."""
    return {str(code): _problem(_ERRORS[code]) for code in codes}


def _op(
    operation_id: str,
    summary: str,
    parameters: list[dict[str, Any]],
    body: dict[str, Any] | None,
    status: int,
    model: str,
    errors: list[int],
) -> dict[str, Any]:
    responses: dict[str, Any] = {
        str(status): {"description": "OK", "content": {"application/json": {"schema": _ref(model)}}}
    }
    responses.update(_problems(errors))
    op: dict[str, Any] = {"operationId": operation_id, "summary": summary, "responses": responses}
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = body
    return op


def _plain(operation_id: str, summary: str, responses: dict[int, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status, model in responses.items():
        media = PROBLEM_TYPE if model == "Problem" else "application/json"
        out[str(status)] = {
            "description": "OK" if status < 400 else "not ready",
            "content": {media: {"schema": _ref(model)}},
        }
    return {"operationId": operation_id, "summary": summary, "security": [], "responses": out}
