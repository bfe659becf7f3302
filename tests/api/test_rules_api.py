"""The HTTP contract of packet rules (issue 31): audience, passphrase, start time, cancel,
sender limits. In-process over real Redis and each SQL database; every response is
checked against the OpenAPI document (tests/api/conftest.py)."""

from __future__ import annotations

import unicodedata
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from starlette.applications import Starlette

from hongbao.api.routes import MAX_BODY
from hongbao.domain.rules import LOCKOUT_SECONDS, WRONG_TRIES
from hongbao.ledger.schema import packet_rules, packets
from hongbao.settings import Settings
from tests.api.conftest import ADMIN, BASE, bearer, eventually
from tests.api.test_api import PACKET_KEYS, balance, deposit, problem, send

pytestmark = [pytest.mark.redis]

PHRASE = "大吉大利"
#: this module's sender limits (the other tests send far less)
SENDS_PER_DAY, SENT_PER_DAY = 3, 1_000_000


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return replace(settings, max_sends_per_day=SENDS_PER_DAY, max_sent_per_day=SENT_PER_DAY)


async def grab(
    client: httpx.AsyncClient, packet_id: str, user: str, body: Any = None, **kw: Any
) -> httpx.Response:
    return await client.post(f"/v1/packets/{packet_id}/grab", json=body, headers=bearer(user), **kw)


async def test_exclusive_packet_and_who_sees_its_audience(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 10_000)
    problem(
        await client.post(
            "/v1/packets",
            json={"total_amount": 300, "count": 2, "mode": "equal", "audience": ["bob"]},
            headers=bearer("alice"),
        ),
        422,
        "invalid_request",
        "count",
    )
    packet = await send(client, "alice", total_amount=300, count=1, audience=["bob", "bob"])
    assert set(packet) == PACKET_KEYS | {"audience_size", "audience", "for_you"}
    assert (packet["audience_size"], packet["audience"], packet["for_you"]) == (1, ["bob"], False)
    seen = (await client.get(f"/v1/packets/{packet['id']}", headers=bearer("carol"))).json()
    assert seen["audience_size"] == 1 and "audience" not in seen and seen["for_you"] is False
    seen = (await client.get(f"/v1/packets/{packet['id']}", headers=bearer("bob"))).json()
    assert "audience" not in seen and seen["for_you"] is True
    seen = (await client.get(f"/v1/packets/{packet['id']}", headers=ADMIN)).json()
    assert seen["audience"] == ["bob"]
    problem(await grab(client, packet["id"], "carol"), 403, "not_in_audience")
    r = await grab(client, packet["id"], "bob")
    assert r.status_code == 200 and r.json()["amount"] == 300
    assert await eventually(lambda: balance(client, "bob"), 300) == 300
    # a plain packet shows none of the rule fields
    plain = await send(client, "alice", total_amount=100, count=1)
    assert set(plain) == PACKET_KEYS


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"audience": []}, "audience"),
        ({"audience": ["ok", "not ok"]}, "audience"),
        ({"audience": [f"u{i}" for i in range(1_001)]}, "audience"),
        ({"audience": "bob"}, "audience"),
        ({"passphrase": ""}, "passphrase"),
        ({"passphrase": "x" * 33}, "passphrase"),
        ({"passphrase": "a\u202eb"}, "passphrase"),
        ({"starts_at": "2026-11-26T20:00:00"}, "starts_at"),
        ({"starts_at": "tomorrow"}, "starts_at"),
        ({"starts_at": "2026-02-30T20:00:00Z"}, "starts_at"),
    ],
)
async def test_bad_rules_are_refused_and_change_nothing(
    client: httpx.AsyncClient, extra: dict[str, Any], field: str
) -> None:
    await deposit(client, "alice", 1_000)
    body = {"total_amount": 100, "count": 1, "mode": "lucky", **extra}
    r = await client.post("/v1/packets", json=body, headers=bearer("alice"))
    problem(r, 422, "invalid_request", field)
    assert await balance(client, "alice") == 1_000


async def test_start_too_far_ahead_is_refused(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1_000)
    late = (datetime.now(UTC) + timedelta(days=8)).isoformat()
    r = await client.post(
        "/v1/packets",
        json={"total_amount": 100, "count": 1, "mode": "lucky", "starts_at": late},
        headers=bearer("alice"),
    )
    problem(r, 422, "invalid_request", "starts_at")


async def test_passphrase_packet(client: httpx.AsyncClient, app: Starlette) -> None:
    await deposit(client, "alice", 10_000)
    packet = await send(client, "alice", total_amount=500, count=5, passphrase=PHRASE)
    assert packet["passphrase_required"] is True
    pid = packet["id"]
    problem(await grab(client, pid, "bob"), 403, "wrong_passphrase")  # no body
    problem(await grab(client, pid, "bob", {}), 403, "wrong_passphrase")
    problem(await grab(client, pid, "bob", {"passphrase": "恭喜"}), 403, "wrong_passphrase")
    # the body is checked like any other: media type, JSON, fields
    r = await client.post(f"/v1/packets/{pid}/grab", content=b"passphrase", headers=bearer("bob"))
    problem(r, 415, "unsupported_media_type")
    r = await client.post(
        f"/v1/packets/{pid}/grab",
        content=b"{",
        headers={**bearer("bob"), "Content-Type": "application/json"},
    )
    problem(r, 400, "malformed_json")
    problem(await grab(client, pid, "bob", {"pass": PHRASE}), 422, "invalid_request", "pass")
    r = await grab(client, pid, "bob", {"passphrase": f" {PHRASE} "})
    assert r.status_code == 200 and r.json()["first"] is True
    # a repeat needs no passphrase: the share is the user's already
    r = await grab(client, pid, "bob")
    assert r.status_code == 200 and r.json()["first"] is False
    for _ in range(WRONG_TRIES - 1):
        problem(await grab(client, pid, "eve", {"passphrase": "guess"}), 403, "wrong_passphrase")
    r = await grab(client, pid, "eve", {"passphrase": "guess"})
    problem(r, 429, "too_many_attempts")
    assert r.headers["retry-after"] == str(LOCKOUT_SECONDS)
    r = await grab(client, pid, "eve", {"passphrase": PHRASE})
    problem(r, 429, "too_many_attempts")
    assert 0 < int(r.headers["retry-after"]) <= LOCKOUT_SECONDS
    # only a keyed digest is kept: neither Redis nor SQL holds the passphrase
    service = app.state.api.runtime.service
    meta = await service.store.client.hgetall(service.store.keys(pid).meta)
    assert PHRASE not in str(meta) and len(meta["ph"]) == 64
    async with service.ledger.engine.connect() as conn:
        rows = (await conn.execute(sa.select(packet_rules))).all()
        sent = (await conn.execute(sa.select(packets.c.request_hash))).all()
    assert PHRASE not in str(rows) and rows[0].passphrase_hash == meta["ph"]
    assert PHRASE not in str(sent)


async def test_a_passphrase_is_counted_in_its_normal_form(client: httpx.AsyncClient) -> None:
    """32 characters in NFC: sent decomposed (NFD, as some keyboards send Hangul) or with
    spaces around it, it takes more, and still matches."""
    phrase = "각" * 32  # 32 syllables in NFC, 96 jamo in NFD
    decomposed = unicodedata.normalize("NFD", phrase)
    assert len(decomposed) == 96
    await deposit(client, "alice", 10_000)
    packet = await send(client, "alice", total_amount=500, count=5, passphrase=decomposed)
    r = await grab(client, packet["id"], "bob", {"passphrase": f"  {decomposed}  "})
    assert r.status_code == 200 and r.json()["first"] is True, r.text
    r = await grab(client, packet["id"], "carol", {"passphrase": phrase})
    assert r.status_code == 200 and r.json()["first"] is True, r.text
    too_long = {"total_amount": 500, "count": 5, "mode": "equal", "passphrase": phrase + "각"}
    r = await client.post("/v1/packets", json=too_long, headers=bearer("alice"))
    problem(r, 422, "invalid_request", "passphrase")


async def test_timed_packet(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1_000)
    start = datetime.now(UTC) + timedelta(seconds=30)
    packet = await send(
        client,
        "alice",
        total_amount=200,
        count=2,
        starts_at=start.astimezone(timezone(timedelta(hours=8))).isoformat(),
        expires_in=60,
    )
    starts_at = datetime.fromisoformat(packet["starts_at"])
    assert abs(starts_at - start) < timedelta(milliseconds=1)
    assert datetime.fromisoformat(packet["expires_at"]) - starts_at == timedelta(seconds=60)
    r = await grab(client, packet["id"], "bob")
    problem(r, 409, "not_started")
    assert 28 <= int(r.headers["retry-after"]) <= 30
    # a start in the past opens the packet at once
    now = await send(client, "alice", total_amount=100, count=1, starts_at="2020-01-01T00:00:00Z")
    assert "starts_at" not in now
    assert (await grab(client, now["id"], "bob")).status_code == 200


async def test_cancel(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1_000)
    packet = await send(client, "alice", total_amount=1_000, count=4, mode="equal")
    pid = packet["id"]
    assert (await grab(client, pid, "bob")).json()["amount"] == 250
    problem(await client.post(f"/v1/packets/{pid}/cancel", headers=bearer("bob")), 403, "forbidden")
    r = await client.post(f"/v1/packets/{pid}/cancel", headers=bearer("alice"))
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["status"] == "cancelled"
    assert (first["remaining_amount"], first["refunded_amount"]) == (750, 750)
    again = await client.post(f"/v1/packets/{pid}/cancel", headers=bearer("alice"))
    assert again.status_code == 200 and again.json() == first
    problem(await grab(client, pid, "carol"), 410, "packet_cancelled")
    assert (await grab(client, pid, "bob")).json()["first"] is False
    assert await eventually(lambda: balance(client, "alice"), 750) == 750
    problem(
        await client.post("/v1/packets/01aaaaaaaaaaaaaaaaaaaaaaaa/cancel", headers=ADMIN),
        404,
        "packet_not_found",
    )
    # an admin may cancel anyone's packet; a packet with nothing left cannot be
    other = await send(client, "alice", total_amount=100, count=1)
    r = await client.post(f"/v1/packets/{other['id']}/cancel", headers=ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    gone = await send(client, "alice", total_amount=100, count=1)
    await grab(client, gone["id"], "bob")
    r = await client.post(f"/v1/packets/{gone['id']}/cancel", headers=bearer("alice"))
    problem(r, 410, "packet_exhausted")


async def test_sender_limits(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 10_000_000)
    for _ in range(SENDS_PER_DAY):
        await send(client, "alice", total_amount=100, count=1)
    r = await client.post(
        "/v1/packets",
        json={"total_amount": 100, "count": 1, "mode": "lucky"},
        headers=bearer("alice"),
    )
    problem(r, 429, "send_limit_reached")
    assert 0 < int(r.headers["retry-after"]) <= 86_400
    assert await balance(client, "alice") == 10_000_000 - 300
    await deposit(client, "bob", 10_000_000)
    await send(client, "bob", total_amount=SENT_PER_DAY, count=100)
    r = await client.post(
        "/v1/packets",
        json={"total_amount": 1, "count": 1, "mode": "lucky"},
        headers=bearer("bob"),
    )
    problem(r, 429, "send_limit_reached")


async def test_fast_and_routed_grabs_read_the_passphrase_alike(
    client: httpx.AsyncClient, app: Starlette
) -> None:
    await deposit(client, "alice", 1_000)
    packet = await send(client, "alice", total_amount=300, count=3, passphrase=PHRASE)
    path = f"/v1/packets/{packet['id']}/grab"
    transport = httpx.ASGITransport(app=app.router)  # the router alone: the routed endpoint
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as routed:
        cases: list[dict[str, Any]] = [
            {"json": {"passphrase": "nope"}},
            {"content": b"{", "headers": {"Content-Type": "application/json"}},
            {"content": b"x" * (MAX_BODY + 1), "headers": {"Content-Type": "application/json"}},
            {"content": b"{}", "headers": {"Content-Type": "text/plain"}},
            {"json": {"passphrase": PHRASE}},
        ]
        for n, case in enumerate(cases):
            user = f"u{n}"
            headers = {**bearer(user), **case.pop("headers", {})}
            fast = await client.post(path, headers=headers, **case)
            slow = await routed.post(path, headers=headers, **case)
            assert fast.status_code == slow.status_code, (case, fast.text, slow.text)
            if fast.status_code != 200:
                assert fast.headers.multi_items() == slow.headers.multi_items()
                assert fast.json() == slow.json()
            else:  # the routed one is the same user again
                assert (fast.json()["first"], slow.json()["first"]) == (True, False)
