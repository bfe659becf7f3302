"""Redis going away under a running app: 503 storage_unavailable, /readyz 503, then recovery."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import redis

from hongbao.app import create_app
from hongbao.errors import ConfigurationError
from hongbao.serving.embedded import EmbeddedServer
from hongbao.settings import Settings
from tests.api.conftest import ADMIN, SECRET, bearer

pytestmark = [pytest.mark.integration]


async def test_redis_outage_gives_503_and_recovers(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "data")
    url = await asyncio.to_thread(server.start)
    try:
        settings = Settings(
            redis_url=url,
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'ledger.sqlite3'}",
            buckets=4,
        )
        app = create_app(settings, SECRET, run_workers=False)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
        ):
            r = await c.post("/v1/wallets/alice/deposits", json={"amount": 1000}, headers=ADMIN)
            assert r.status_code == 201
            r = await c.post(
                "/v1/packets",
                json={"total_amount": 300, "count": 3, "mode": "equal"},
                headers=bearer("alice"),
            )
            pid = r.json()["id"]
            first = await c.post(f"/v1/packets/{pid}/grab", headers=bearer("bob"))
            assert first.status_code == 200

            await asyncio.to_thread(server.stop)
            r = await c.get("/readyz")
            assert r.status_code == 503 and r.json()["code"] == "storage_unavailable"
            assert "redis" in r.json()["detail"]
            for call in (
                c.post(f"/v1/packets/{pid}/grab", headers=bearer("carol")),
                c.get(f"/v1/packets/{pid}", headers=bearer("carol")),
                c.get(f"/v1/packets/{pid}/claims", headers=bearer("carol")),
            ):
                r = await call
                assert r.status_code == 503, r.text
                assert r.headers["content-type"] == "application/problem+json"
                assert r.json()["code"] == "storage_unavailable"
                assert r.headers["retry-after"] == "1"
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/metrics")).status_code == 200
            r = await c.get("/v1/wallets/alice", headers=bearer("alice"))  # SQL only
            assert r.json()["balance"] == 700

            await asyncio.to_thread(server.start)  # same data dir, same socket: AOF replayed
            deadline = asyncio.get_running_loop().time() + 15
            while (await c.get("/readyz")).status_code != 200:
                assert asyncio.get_running_loop().time() < deadline, "not ready again"
                await asyncio.sleep(0.1)
            again = await c.post(f"/v1/packets/{pid}/grab", headers=bearer("bob"))
            assert again.json() == {**first.json(), "first": False}
            r = await c.post(f"/v1/packets/{pid}/grab", headers=bearer("carol"))
            assert r.status_code == 200 and r.json()["first"] is True
    finally:
        await asyncio.to_thread(server.stop)


async def test_readyz_and_start_refuse_a_redis_that_may_evict(tmp_path: Path) -> None:
    """maxmemory-policy can change at run time (CONFIG SET): /readyz looks every time."""
    server = EmbeddedServer(tmp_path / "data")
    url = server.start()  # this thread outlives the test: the server dies with its starter
    admin = redis.Redis.from_url(url)
    try:
        settings = Settings(
            redis_url=url, database_url=f"sqlite+aiosqlite:///{tmp_path / 'l.sqlite3'}", buckets=4
        )
        app = create_app(settings, SECRET, run_workers=True)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
        ):
            assert (await c.get("/readyz")).status_code == 200
            admin.config_set("maxmemory-policy", "allkeys-lru")
            r = await c.get("/readyz")
            assert r.status_code == 503 and r.json()["code"] == "redis_may_evict", r.text
            assert "allkeys-lru" in r.json()["detail"]

        refused = create_app(settings, SECRET, run_workers=False)
        with pytest.raises(ConfigurationError, match="maxmemory-policy is allkeys-lru"):
            async with refused.router.lifespan_context(refused):
                pass

        lenient = create_app(replace(settings, allow_eviction=True), SECRET, run_workers=True)
        async with (
            lenient.router.lifespan_context(lenient),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=lenient), base_url="http://t") as c,
        ):
            assert (await c.get("/readyz")).status_code == 200
    finally:
        admin.close()
        await asyncio.to_thread(server.stop)
