"""Fixtures for the HTTP API tests: the app on real Redis + SQL, an httpx client, tokens.

Every response the in-process client receives is checked against the app's own
OpenAPI document (status documented, media type, body schema), so the document
stays accurate as the tests exercise every row of the contract.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import jsonschema_rs
import pytest
from starlette.applications import Starlette

from hongbao.api.openapi import build_openapi
from hongbao.app import create_app
from hongbao.ledger import SqlLedger
from hongbao.settings import Settings
from hongbao.storage import RedisStore
from tests.tokens import hs256

SECRET = b"api-tests-secret-0123456789abcdef"
#: the API tests use their own Redis database: the other suites (db 1) flush theirs and run
#: persisters of their own, which must not consume or delete this suite's events
API_REDIS_DB = int(os.environ.get("HONGBAO_TEST_API_REDIS_DB", "2"))
BASE = "http://hongbao.test"


def bearer(user: str, *, admin: bool = False, secret: bytes = SECRET, **kw: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {hs256(user, secret, admin=admin, **kw)}"}


ADMIN = bearer("admin", admin=True)


@pytest.fixture(scope="session")
def redis_url(redis_url: str) -> str:
    parts = urlsplit(redis_url)
    return urlunsplit(parts._replace(path=f"/{API_REDIS_DB}"))


# -- the OpenAPI document as a response checker ---------------------------------------------


class OpenApiChecker:
    """Checks a response against the operation the request hit in an OpenAPI document."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.routes = [
            (re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", path) + "$"), path)
            for path in doc["paths"]
        ]
        self._validators: dict[str, Any] = {}

    def operation(self, method: str, path: str) -> dict[str, Any] | None:
        for pattern, template in self.routes:
            if pattern.match(path):
                return self.doc["paths"][template].get(method.lower())  # type: ignore[no-any-return]
        return None

    def check(self, method: str, path: str, status: int, media: str, body: bytes) -> None:
        op = self.operation(method, path)
        if op is None:
            assert status in (404, 405), f"{method} {path} is not documented but gave {status}"
            assert media == "application/problem+json"
            return
        documented = op["responses"].get(str(status))
        assert documented is not None, f"{method} {path}: status {status} not documented: {body!r}"
        if "content" not in documented:  # a 204
            assert body == b"", f"{method} {path} {status}: documented without a body"
            return
        content = documented["content"]
        assert media in content, f"{method} {path} {status}: media type {media} not documented"
        if media.endswith("json"):
            self.validator(content[media]["schema"]).validate(json.loads(body))

    def validator(self, schema: dict[str, Any]) -> Any:
        key = json.dumps(schema, sort_keys=True)
        if key not in self._validators:
            root = {**schema, "components": self.doc["components"]}
            self._validators[key] = jsonschema_rs.Draft202012Validator(root, validate_formats=True)
        return self._validators[key]


@cache
def checker() -> OpenApiChecker:
    return OpenApiChecker(build_openapi(Settings()))


async def _check_response(response: httpx.Response) -> None:
    await response.aread()
    media = response.headers.get("content-type", "").split(";")[0].strip()
    checker().check(
        response.request.method,
        response.request.url.path,
        response.status_code,
        media,
        response.content,
    )


# -- app and client -------------------------------------------------------------------------


@pytest.fixture
async def app(settings: Settings, store: RedisStore, ledger: SqlLedger) -> AsyncIterator[Starlette]:
    """The app with the persister and sweeper running, on a flushed Redis and an empty ledger."""
    application = create_app(settings, SECRET, run_workers=True)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url=BASE, event_hooks={"response": [_check_response]}
    ) as c:
        yield c


async def eventually(
    probe: Callable[[], Awaitable[Any]], expected: Any, within: float = 15.0
) -> Any:
    """Poll `probe` until it returns `expected` (persister and sweeper work asynchronously)."""
    deadline = time.monotonic() + within
    while True:
        got = await probe()
        if got == expected or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)
