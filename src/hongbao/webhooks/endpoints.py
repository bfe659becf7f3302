"""Registering webhook endpoints: where events go, which ones, and the signing secret."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from datetime import timedelta
from urllib.parse import urlsplit

from hongbao.errors import InvalidRequest, WebhookNotFound
from hongbao.ledger import SqlLedger
from hongbao.ledger.outbox import EVENT_TYPES, new_event_id
from hongbao.ledger.webhook_records import EndpointRecord
from hongbao.ledger.webhook_store import WebhookStore

#: after a rotation the old secret signs too, so receivers can switch without a gap
PREVIOUS_SECRET_VALID = timedelta(hours=24)
MAX_URL = 2048
#: the secret's random bytes (Standard Webhooks asks for 24 to 64)
SECRET_BYTES = 32


def new_secret() -> str:
    """ "whsec_" and base64 of random bytes, the form Standard Webhooks libraries take."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def new_endpoint_id() -> str:
    return "we_" + new_event_id().removeprefix("evt_").lower()


def check_url(url: object) -> str:
    """An http(s) URL with a host and no credentials; InvalidRequest naming `url`."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest("url must be an http:// or https:// URL", "url")
    if len(url) > MAX_URL:
        raise InvalidRequest(f"url must be at most {MAX_URL} characters", "url")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError:
        raise InvalidRequest("url is not a valid URL", "url") from None
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidRequest("url must be an http:// or https:// URL with a host", "url")
    if parts.username is not None or parts.password is not None:
        raise InvalidRequest("url must not carry a user name or password", "url")
    if parts.fragment or any(c.isspace() or ord(c) < 32 for c in url):
        raise InvalidRequest("url must not have a fragment, spaces or control characters", "url")
    return url


def check_event_types(types: object) -> list[str]:
    """1 or more of EVENT_TYPES, repeats counted once; InvalidRequest naming `events`."""
    if not isinstance(types, list | tuple) or not types:
        raise InvalidRequest("events must list at least one event type", "events")
    unknown = [t for t in types if not isinstance(t, str) or t not in EVENT_TYPES]
    if unknown:
        raise InvalidRequest(
            f"unknown event type {unknown[0]!r}; known: {', '.join(EVENT_TYPES)}", "events"
        )
    return list(dict.fromkeys(types))


class WebhookEndpoints:
    """Endpoints of one ledger; each method raises the typed errors of hongbao.errors."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.store = WebhookStore(ledger)

    async def create(self, url: str, event_types: Sequence[str]) -> EndpointRecord:
        return await self.store.create_endpoint(
            new_endpoint_id(), check_url(url), check_event_types(list(event_types)), new_secret()
        )

    async def list(self) -> list[EndpointRecord]:
        return await self.store.endpoints()

    async def get(self, endpoint_id: str) -> EndpointRecord:
        found = await self.store.endpoint(endpoint_id)
        if found is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id[:40]!r}")
        return found

    async def delete(self, endpoint_id: str) -> None:
        if not await self.store.delete_endpoint(endpoint_id):
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id[:40]!r}")

    async def rotate_secret(self, endpoint_id: str) -> EndpointRecord:
        """A new secret; the current one also signs for PREVIOUS_SECRET_VALID."""
        found = await self.store.rotate_secret(endpoint_id, new_secret(), PREVIOUS_SECRET_VALID)
        if found is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id[:40]!r}")
        return found

    async def enable(self, endpoint_id: str) -> EndpointRecord:
        """Let a disabled endpoint receive events again; its parked deliveries stay parked
        until an operator retries them."""
        found = await self.store.enable_endpoint(endpoint_id)
        if found is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id[:40]!r}")
        return found
