"""Registering webhook endpoints: where events go, which ones, and the signing secret."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
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
#: the most events one message may carry (an endpoint's `batch_size`)
MAX_BATCH_SIZE = 100


def new_secret() -> str:
    """ "whsec_" and base64 of random bytes, the form Standard Webhooks libraries take."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def new_endpoint_id() -> str:
    return "we_" + new_event_id().removeprefix("evt_").lower()


@dataclass(frozen=True)
class AllowedHosts:
    """The hosts webhooks may go to (HONGBAO_WEBHOOK_HOSTS): names and addresses, and
    ".example.com" for its subdomains. With none named, any host is allowed."""

    exact: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, spec: str) -> AllowedHosts:
        names = [n.strip().strip("[]").rstrip(".").lower() for n in spec.split(",")]
        return cls(
            frozenset(n for n in names if n and not n.startswith(".")),
            tuple(n for n in names if n.startswith(".")),
        )

    @property
    def any_host(self) -> bool:
        return not self.exact and not self.suffixes

    def allows(self, host: str) -> bool:
        """Whether `host` (as urlsplit gives it: lower case, no brackets) is allowed."""
        if self.any_host:
            return True
        host = host.rstrip(".")
        return host in self.exact or host.endswith(self.suffixes)

    def allows_url(self, url: str) -> bool:
        if self.any_host:  # no parsing of every URL when nothing is restricted
            return True
        try:
            host = urlsplit(url).hostname
        except ValueError:
            return False
        return host is not None and self.allows(host)


ANY_HOST = AllowedHosts()


def check_url(url: object, hosts: AllowedHosts = ANY_HOST) -> str:
    """An http(s) URL with an allowed host and no credentials; InvalidRequest naming
    `url`."""
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
    if not hosts.allows(host):
        raise InvalidRequest(
            f"url's host {host!r} is not among the hosts webhooks may be sent to "
            "(HONGBAO_WEBHOOK_HOSTS)",
            "url",
        )
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


def check_batch_size(size: object) -> int:
    """1 to MAX_BATCH_SIZE events a message; InvalidRequest naming `batch_size`."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
        raise InvalidRequest(
            f"batch_size must be a whole number from 1 to {MAX_BATCH_SIZE}", "batch_size"
        )
    return size


class WebhookEndpoints:
    """Endpoints of one ledger; each method raises the typed errors of hongbao.errors."""

    def __init__(self, ledger: SqlLedger, hosts: AllowedHosts = ANY_HOST) -> None:
        self.store = WebhookStore(ledger)
        self.hosts = hosts

    async def create(
        self, url: str, event_types: Sequence[str], *, batch_size: int = 1
    ) -> EndpointRecord:
        """A new endpoint; `batch_size` above 1 sends it up to that many events of one
        subject in one message (hongbao.webhooks.dispatcher)."""
        return await self.store.create_endpoint(
            new_endpoint_id(),
            check_url(url, self.hosts),
            check_event_types(list(event_types)),
            new_secret(),
            check_batch_size(batch_size),
        )

    async def update(
        self,
        endpoint_id: str,
        *,
        url: str | None = None,
        event_types: Sequence[str] | None = None,
        batch_size: int | None = None,
    ) -> EndpointRecord:
        """Change what is given (checked as on create); the secret and the queue stay."""
        updated = await self.store.update_endpoint(
            endpoint_id,
            url=None if url is None else check_url(url, self.hosts),
            event_types=None if event_types is None else check_event_types(list(event_types)),
            batch_size=None if batch_size is None else check_batch_size(batch_size),
        )
        return _found(updated, endpoint_id)

    async def list(self) -> list[EndpointRecord]:
        return await self.store.endpoints()

    async def get(self, endpoint_id: str) -> EndpointRecord:
        return _found(await self.store.endpoint(endpoint_id), endpoint_id)

    async def delete(self, endpoint_id: str) -> None:
        if not await self.store.delete_endpoint(endpoint_id):
            raise _not_found(endpoint_id)

    async def rotate_secret(self, endpoint_id: str) -> EndpointRecord:
        """A new secret; the current one also signs for PREVIOUS_SECRET_VALID."""
        rotated = await self.store.rotate_secret(endpoint_id, new_secret(), PREVIOUS_SECRET_VALID)
        return _found(rotated, endpoint_id)

    async def enable(self, endpoint_id: str) -> EndpointRecord:
        """Let a disabled endpoint receive events again; its parked deliveries stay parked
        until an operator retries them."""
        return _found(await self.store.enable_endpoint(endpoint_id), endpoint_id)


def _found(endpoint: EndpointRecord | None, endpoint_id: str) -> EndpointRecord:
    """`endpoint`, or WebhookNotFound naming `endpoint_id` when there is none."""
    if endpoint is None:
        raise _not_found(endpoint_id)
    return endpoint


def _not_found(endpoint_id: str) -> WebhookNotFound:
    return WebhookNotFound(f"no webhook endpoint {endpoint_id[:40]!r}")
