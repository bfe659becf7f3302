"""Webhook endpoints over HTTP, for admins.

- ``POST /v1/webhooks`` ``{"url", "events", "batch_size"?}``: register one; the answer
  carries its signing secret (``whsec_…``), shown here and on rotation only;
- ``GET /v1/webhooks``, ``GET /v1/webhooks/{webhook_id}``: the endpoints;
- ``PATCH /v1/webhooks/{webhook_id}`` ``{"url"?, "events"?, "batch_size"?}``: change
  them; the secret and the queued events stay;
- ``DELETE /v1/webhooks/{webhook_id}``: remove it (nothing more is sent to it);
- ``POST /v1/webhooks/{webhook_id}/rotate-secret``: a new secret; the old one signs
  too for 24 hours;
- ``POST /v1/webhooks/{webhook_id}/enable``: it receives events again after a 410 Gone
  disabled it (its parked deliveries stay parked until ``hongbao webhooks retry-all``).

Every call needs the hongbao:admin role. Checks run in the API's order: token (401),
permission (403), then the body (413, 415, 422).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hongbao.api.routes import Api, read_json, route_by_method
from hongbao.api.schemas import iso
from hongbao.errors import Forbidden, InvalidRequest
from hongbao.ledger.outbox import EVENT_TYPES, EventType
from hongbao.ledger.webhook_records import EndpointRecord
from hongbao.webhooks.endpoints import MAX_BATCH_SIZE, MAX_URL


class WebhookRequest(BaseModel):
    model_config = {"extra": "forbid", "strict": True}

    url: str = Field(
        min_length=1, max_length=MAX_URL, description="http:// or https:// URL events go to"
    )
    events: list[EventType] = Field(
        min_length=1, max_length=len(EVENT_TYPES), description="the event types it receives"
    )
    batch_size: int = Field(
        default=1,
        ge=1,
        le=MAX_BATCH_SIZE,
        description='the most events one message carries; above 1 the body is {"type": '
        '"batch", "data": {"events": [...]}}, the events of one subject in order',
    )


class WebhookUpdate(BaseModel):
    """What a PATCH changes: any of the registration's fields, at least one."""

    model_config = {"extra": "forbid", "strict": True}

    url: str | None = Field(
        default=None, min_length=1, max_length=MAX_URL, description="http:// or https:// URL"
    )
    events: list[EventType] | None = Field(
        default=None, min_length=1, max_length=len(EVENT_TYPES), description="the event types"
    )
    batch_size: int | None = Field(
        default=None, ge=1, le=MAX_BATCH_SIZE, description="the most events one message carries"
    )


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[EventType]
    enabled: bool
    disabled_reason: str | None = Field(
        description="why it stopped receiving (its receiver answered 410 Gone)"
    )
    created_at: str
    batch_size: int = Field(description="the most events one message carries")
    secret: str | None = Field(
        default=None,
        description="the signing secret (whsec_…); only in the answers of create and rotate",
    )
    previous_secret_expires_at: str | None = Field(
        default=None, description="until when the secret before the last rotation signs too"
    )


class WebhookListOut(BaseModel):
    webhooks: list[WebhookOut]


MODELS: list[type[BaseModel]] = [WebhookOut, WebhookListOut]


def webhook_json(endpoint: EndpointRecord, *, secret: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": endpoint.id,
        "url": endpoint.url,
        "events": list(endpoint.event_types),
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
        "created_at": iso(endpoint.created_at),
        "batch_size": endpoint.batch_size,
    }
    if secret:
        out["secret"] = endpoint.secret
        until = endpoint.previous_secret_until
        out["previous_secret_expires_at"] = _iso_or_none(until)
    return out


def _iso_or_none(moment: datetime | None) -> str | None:
    return None if moment is None else iso(moment)


class WebhooksApi:
    """The webhook endpoints' routes, on the service and token check of an `Api`."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def routes(self) -> list[Route]:
        return [
            route_by_method("/v1/webhooks", {"GET": self.list, "POST": self.create}),
            route_by_method(
                "/v1/webhooks/{webhook_id}",
                {"GET": self.get, "PATCH": self.update, "DELETE": self.delete},
            ),
            Route("/v1/webhooks/{webhook_id}/rotate-secret", self.rotate, methods=["POST"]),
            Route("/v1/webhooks/{webhook_id}/enable", self.enable, methods=["POST"]),
        ]

    async def admin(self, request: Request) -> None:
        caller = await self.api.caller(request)
        if not caller.admin:
            raise Forbidden("only an admin may manage webhooks")

    async def create(self, request: Request) -> Response:
        await self.admin(request)
        body = await read_json(request, WebhookRequest)
        endpoint = await self.api.service.webhooks.create(
            body.url, body.events, batch_size=body.batch_size
        )
        return JSONResponse(webhook_json(endpoint, secret=True), status_code=201)

    async def list(self, request: Request) -> Response:
        await self.admin(request)
        endpoints = await self.api.service.webhooks.list()
        return JSONResponse({"webhooks": [webhook_json(e) for e in endpoints]})

    async def get(self, request: Request) -> Response:
        await self.admin(request)
        endpoint = await self.api.service.webhooks.get(request.path_params["webhook_id"])
        return JSONResponse(webhook_json(endpoint))

    async def update(self, request: Request) -> Response:
        await self.admin(request)
        body = await read_json(request, WebhookUpdate)
        if body.url is None and body.events is None and body.batch_size is None:
            raise InvalidRequest("give at least one of url, events and batch_size", "body")
        endpoint = await self.api.service.webhooks.update(
            request.path_params["webhook_id"],
            url=body.url,
            event_types=body.events,
            batch_size=body.batch_size,
        )
        return JSONResponse(webhook_json(endpoint))

    async def delete(self, request: Request) -> Response:
        await self.admin(request)
        await self.api.service.webhooks.delete(request.path_params["webhook_id"])
        return Response(status_code=204)

    async def rotate(self, request: Request) -> Response:
        await self.admin(request)
        webhook_id = request.path_params["webhook_id"]
        endpoint = await self.api.service.webhooks.rotate_secret(webhook_id)
        return JSONResponse(webhook_json(endpoint, secret=True))

    async def enable(self, request: Request) -> Response:
        await self.admin(request)
        endpoint = await self.api.service.webhooks.enable(request.path_params["webhook_id"])
        return JSONResponse(webhook_json(endpoint))
