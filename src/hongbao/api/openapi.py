"""The OpenAPI 3.1 document, from the pydantic models and the running settings.

The paths of the red-packet record, withdrawals and webhooks are built in
openapi_paths.py; the operations, parameters and problem answers of every path by the
functions of openapi_ops.py."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

import hongbao
from hongbao.api.history import MODELS as HISTORY_MODELS
from hongbao.api.openapi_ops import REF, body, operation, path_param, plain, problems, ref
from hongbao.api.openapi_paths import history_paths, webhook_paths, withdrawal_paths
from hongbao.api.routes import (
    DEFAULT_CLAIMS_PAGE,
    IDEMPOTENCY_KEY_PATTERN,
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
from hongbao.api.webhooks import WebhookRequest, WebhookUpdate
from hongbao.api.withdrawals import MODELS as WITHDRAWAL_MODELS
from hongbao.domain.ids import PACKET_ID_PATTERN, USER_ID_PATTERN
from hongbao.settings import Settings

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
    (WebhookUpdate, "validation"),
    *((model, "serialization") for model in WEBHOOK_MODELS),
]


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

    user = path_param("user_id", {"type": "string", "pattern": USER_ID_PATTERN})
    packet = path_param("packet_id", {"type": "string", "pattern": PACKET_ID_PATTERN.pattern})
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
            "post": operation(
                "deposit",
                "Add money to a wallet (admin only)",
                [user, idempotency],
                body("DepositRequest"),
                201,
                "WalletOut",
                [400, 401, 403, 404, 409, 413, 415, 422, 503],
            )
        },
        "/v1/wallets/{user_id}": {
            "get": operation(
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
            "post": operation(
                "sendPacket",
                "Send a red packet (debits the caller)",
                [idempotency, behalf],
                body("SendRequest"),
                201,
                "PacketOut",
                [400, 401, 403, 404, 409, 413, 415, 422, 429, 503],
            )
        },
        "/v1/packets/{packet_id}": {
            "get": operation(
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
            "post": operation(
                "grabPacket",
                "Take one share; the same caller again gets the same share",
                [packet, behalf],
                {**body("GrabRequest"), "required": False},
                200,
                "GrabOut",
                [400, 401, 403, 404, 409, 410, 413, 415, 422, 429, 503],
            )
        },
        "/v1/packets/{packet_id}/cancel": {
            "post": operation(
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
            "get": operation(
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
            "post": operation(
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
            "post": operation(
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
            "get": operation(
                "adminStats",
                "The dashboard's numbers (admin only)",
                [],
                None,
                200,
                "AdminStats",
                [401, 403, 503],
            )
        },
        **history_paths(user),
        **withdrawal_paths(user, idempotency, behalf),
        **webhook_paths(),
        "/healthz": {"get": plain("healthz", "The process is up", {200: "Health"})},
        "/readyz": {
            "get": plain("readyz", "Redis and the database answer", {200: "Health", 503: "Problem"})
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
        sign_in = operation(
            "demoToken",
            "Demo sign-in: a user token for a name; the first sign-in deposits demo money",
            [],
            body("DemoSignIn"),
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
        "properties": {"packet": ref("PacketOut"), "claims": ref("ClaimsOut")},
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
        "responses": {"200": stream, **problems([401, 404, 503])},
    }
