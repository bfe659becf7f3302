"""Rate limits (Redis token buckets) and identity: a token acts only as its own user."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest
from starlette.applications import Starlette

from hongbao.app import create_app
from hongbao.errors import RateLimited
from hongbao.ledger import SqlLedger
from hongbao.ratelimit import RateLimiter
from hongbao.settings import Settings
from hongbao.storage import RedisStore
from tests.tokens import hs256

pytestmark = [
    pytest.mark.redis,
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]

SECRET = b"ratelimit-tests-secret-0123456789abcdef"


def bearer(user: str, *, admin: bool = False, secret: bytes = SECRET, **kw: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {hs256(user, secret, admin=admin, **kw)}"}


async def test_token_bucket_burst_then_refuse(store: RedisStore, settings: Settings) -> None:
    limiter = RateLimiter(store, replace(settings, rate_limit_user=2.0, rate_limit_burst=3))
    for _ in range(3):
        await limiter.check("grab", "alice", "10.0.0.1")
    with pytest.raises(RateLimited) as refused:
        await limiter.check("grab", "alice", "10.0.0.1")
    assert 0 < refused.value.retry_after <= 0.5 and refused.value.retry_after_header == "1"
    await limiter.check("grab", "bob", "10.0.0.1")  # another user has their own bucket
    await limiter.check("send", "alice", "10.0.0.1")  # and another action too


async def test_ip_limit_is_shared_by_users(store: RedisStore, settings: Settings) -> None:
    limiter = RateLimiter(store, replace(settings, rate_limit_ip=1.0, rate_limit_burst=2))
    await limiter.check("grab", "a", "10.0.0.9")
    await limiter.check("grab", "b", "10.0.0.9")
    with pytest.raises(RateLimited):
        await limiter.check("grab", "c", "10.0.0.9")
    await limiter.check("grab", "c", "10.0.0.10")


async def test_disabled_by_default(store: RedisStore, settings: Settings) -> None:
    limiter = RateLimiter(store, settings)
    assert not limiter.enabled
    for _ in range(100):
        await limiter.check("grab", "alice", "10.0.0.1")


@pytest.fixture
async def client(
    settings: Settings, store: RedisStore, ledger: SqlLedger
) -> AsyncIterator[httpx.AsyncClient]:
    limited = replace(settings, rate_limit_user=0.5, rate_limit_ip=0.0, rate_limit_burst=2)
    app: Starlette = create_app(limited, SECRET, run_workers=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            yield c


async def _packet(client: httpx.AsyncClient, count: int = 10) -> str:
    r = await client.post(
        "/v1/wallets/sender/deposits", json={"amount": 10_000}, headers=bearer("admin", admin=True)
    )
    assert r.status_code == 201, r.text
    r = await client.post(
        "/v1/packets",
        json={"total_amount": 1000, "count": count, "mode": "equal"},
        headers=bearer("sender"),
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def test_api_answers_429_with_retry_after(client: httpx.AsyncClient) -> None:
    pid = await _packet(client)
    codes = [
        (await client.post(f"/v1/packets/{pid}/grab", headers=bearer("alice"))).status_code
        for _ in range(2)
    ]
    assert codes == [200, 200]
    r = await client.post(f"/v1/packets/{pid}/grab", headers=bearer("alice"))
    assert r.status_code == 429
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "rate_limited" and r.json()["status"] == 429
    assert int(r.headers["Retry-After"]) >= 1
    other = await client.post(f"/v1/packets/{pid}/grab", headers=bearer("bob"))
    assert other.status_code == 200  # per user: bob is not slowed down by alice


async def test_a_token_acts_only_as_its_user(client: httpx.AsyncClient) -> None:
    pid = await _packet(client)
    r = await client.post(f"/v1/packets/{pid}/grab", headers=bearer("alice"))
    assert r.status_code == 200 and r.json()["user_id"] == "alice"
    # another user's wallet: refused
    r = await client.get("/v1/wallets/bob", headers=bearer("alice"))
    assert r.status_code == 403
    # a token whose payload names bob but carries alice's signature: refused
    head, payload, sig = hs256("alice", SECRET).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged_payload = claims | {next(k for k, v in claims.items() if v == "alice"): "bob"}
    raw = json.dumps(forged_payload, separators=(",", ":")).encode()
    forged = f"{head}.{base64.urlsafe_b64encode(raw).rstrip(b'=').decode()}.{sig}"
    r = await client.post(f"/v1/packets/{pid}/grab", headers={"Authorization": f"Bearer {forged}"})
    assert r.status_code == 401
    # signed with another secret, expired, or not admin for a deposit: refused
    other_secret = bearer("bob", secret=b"another-secret-0123456789abcdef012345")
    assert (await client.post(f"/v1/packets/{pid}/grab", headers=other_secret)).status_code == 401
    expired = bearer("bob", ttl=1, now=1_000_000)
    assert (await client.post(f"/v1/packets/{pid}/grab", headers=expired)).status_code == 401
    r = await client.post("/v1/wallets/alice/deposits", json={"amount": 5}, headers=bearer("alice"))
    assert r.status_code == 403
    claims_list = (await client.get(f"/v1/packets/{pid}/claims", headers=bearer("x"))).json()
    assert [c["user_id"] for c in claims_list["claims"]] == ["alice"]  # nobody grabbed as bob
