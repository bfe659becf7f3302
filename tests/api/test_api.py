"""The HTTP contract of issue 3, in-process over real Redis and each SQL database."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import httpx
import pytest

from tests.api.conftest import ADMIN, SECRET, bearer, eventually
from tests.tokens import hs256

pytestmark = [pytest.mark.redis]

PACKET_KEYS = {
    "id",
    "sender_id",
    "total_amount",
    "count",
    "mode",
    "greeting",
    "status",
    "remaining_count",
    "remaining_amount",
    "refunded_amount",
    "created_at",
    "expires_at",
}
UNKNOWN_PACKET = "01aaaaaaaaaaaaaaaaaaaaaaaa"


async def deposit(client: httpx.AsyncClient, user: str, amount: int) -> httpx.Response:
    return await client.post(f"/v1/wallets/{user}/deposits", json={"amount": amount}, headers=ADMIN)


async def balance(client: httpx.AsyncClient, user: str) -> int:
    r = await client.get(f"/v1/wallets/{user}", headers=ADMIN)
    assert r.status_code == 200, r.text
    value: int = r.json()["balance"]
    return value


async def send(
    client: httpx.AsyncClient, sender: str, status: int = 201, headers: Any = None, **body: Any
) -> dict[str, Any]:
    body.setdefault("mode", "lucky")
    r = await client.post("/v1/packets", json=body, headers={**bearer(sender), **(headers or {})})
    assert r.status_code == status, r.text
    out: dict[str, Any] = r.json()
    return out


def problem(r: httpx.Response, status: int, code: str, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["code"] == code
    assert body["type"].endswith(code) and body["title"] and body["detail"]
    assert body.get("field") == field, body
    return body


# -- wallets ----------------------------------------------------------------------------------


async def test_deposit_and_read_wallets(client: httpx.AsyncClient) -> None:
    r = await deposit(client, "alice", 500)
    assert r.status_code == 201 and r.json() == {"user_id": "alice", "balance": 500}
    r = await deposit(client, "alice", 250)
    assert r.json() == {"user_id": "alice", "balance": 750}
    r = await client.get("/v1/wallets/alice", headers=bearer("alice"))
    assert r.status_code == 200 and r.json() == {"user_id": "alice", "balance": 750}
    r = await client.get("/v1/wallets/alice", headers=ADMIN)
    assert r.json() == {"user_id": "alice", "balance": 750}
    r = await client.get("/v1/wallets/nobody", headers=bearer("nobody"))
    assert r.json() == {"user_id": "nobody", "balance": 0}


async def test_deposit_idempotency_key(client: httpx.AsyncClient) -> None:
    headers = {**ADMIN, "Idempotency-Key": "topup-1"}
    for _ in range(2):
        r = await client.post("/v1/wallets/alice/deposits", json={"amount": 300}, headers=headers)
        assert r.status_code == 201 and r.json()["balance"] == 300
    r = await client.post("/v1/wallets/alice/deposits", json={"amount": 301}, headers=headers)
    problem(r, 409, "idempotency_conflict")
    assert await balance(client, "alice") == 300


async def test_forbidden(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 100)
    problem(await client.get("/v1/wallets/alice", headers=bearer("bob")), 403, "forbidden")
    r = await client.post("/v1/wallets/bob/deposits", json={"amount": 1000}, headers=bearer("bob"))
    problem(r, 403, "forbidden")
    r = await client.post(
        "/v1/wallets/alice/deposits", json={"amount": 1000}, headers=bearer("alice")
    )
    problem(r, 403, "forbidden")
    assert await balance(client, "alice") == 100
    assert await balance(client, "bob") == 0


async def test_bad_user_ids(client: httpx.AsyncClient) -> None:
    bad = "x" * 65
    problem(await deposit(client, bad, 100), 422, "invalid_request", "user_id")
    r = await client.get(f"/v1/wallets/{bad}", headers=ADMIN)
    problem(r, 422, "invalid_request", "user_id")
    problem(await client.get(f"/v1/wallets/{bad}", headers=bearer("bob")), 403, "forbidden")


# -- packets ----------------------------------------------------------------------------------


async def test_send_and_read_packet(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 10_000)
    packet = await send(client, "alice", total_amount=1000, count=3, greeting="恭喜发财🧧")
    assert set(packet) == PACKET_KEYS
    assert packet["sender_id"] == "alice" and packet["mode"] == "lucky"
    assert (packet["total_amount"], packet["count"], packet["greeting"]) == (1000, 3, "恭喜发财🧧")
    assert packet["status"] == "active"
    assert (packet["remaining_count"], packet["remaining_amount"]) == (3, 1000)
    created = datetime.fromisoformat(packet["created_at"])
    expires = datetime.fromisoformat(packet["expires_at"])
    assert created.utcoffset() == timedelta(0) and packet["created_at"].endswith("Z")
    assert expires - created == timedelta(seconds=86_400)
    assert await balance(client, "alice") == 9000

    r = await client.get(f"/v1/packets/{packet['id']}", headers=bearer("someone"))
    assert r.status_code == 200 and r.json() == packet

    equal = await send(client, "alice", total_amount=301, count=3, mode="equal", expires_in=60)
    assert equal["mode"] == "equal" and equal["greeting"] == ""
    span = datetime.fromisoformat(equal["expires_at"]) - datetime.fromisoformat(equal["created_at"])
    assert span == timedelta(seconds=60)
    assert await balance(client, "alice") == 8699


async def test_grab_repeat_exhausted_and_claims(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 10_000)
    packet = await send(client, "alice", total_amount=1000, count=3)
    pid = packet["id"]
    got = {}
    for user in ("u1", "u2", "u3"):
        r = await client.post(f"/v1/packets/{pid}/grab", headers=bearer(user))
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"packet_id", "user_id", "amount", "seq", "first"}
        assert body["packet_id"] == pid and body["user_id"] == user and body["first"] is True
        got[user] = body
    assert sum(g["amount"] for g in got.values()) == 1000
    assert sorted(g["seq"] for g in got.values()) == [1, 2, 3]

    r = await client.post(f"/v1/packets/{pid}/grab", headers=bearer("u2"))
    assert r.status_code == 200 and r.json() == {**got["u2"], "first": False}
    problem(
        await client.post(f"/v1/packets/{pid}/grab", headers=bearer("u4")),
        410,
        "packet_exhausted",
    )

    r = await client.get(f"/v1/packets/{pid}/claims", headers=bearer("u4"))
    assert r.status_code == 200
    claims = r.json()
    assert claims["packet_id"] == pid
    assert [c["user_id"] for c in claims["claims"]] == ["u1", "u2", "u3"]
    for c in claims["claims"]:
        assert set(c) == {"user_id", "amount", "seq", "claimed_at"}
        assert (c["amount"], c["seq"]) == (got[c["user_id"]]["amount"], got[c["user_id"]]["seq"])
    best = max(got.values(), key=lambda g: (g["amount"], -g["seq"]))
    top = max(g["amount"] for g in got.values())
    assert claims["best_luck"] in {u for u, g in got.items() if g["amount"] == top}
    assert best["amount"] == top

    r = await client.get(f"/v1/packets/{pid}", headers=bearer("u1"))
    assert r.json()["status"] == "exhausted"
    assert (r.json()["remaining_count"], r.json()["remaining_amount"]) == (0, 0)
    for user, g in got.items():  # the persister credits the winners
        assert await eventually(partial(balance, client, user), g["amount"]) == g["amount"]


async def test_claims_before_exhaustion_have_no_best_luck(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    pid = (await send(client, "alice", total_amount=100, count=2))["id"]
    r = await client.get(f"/v1/packets/{pid}/claims", headers=bearer("x"))
    assert r.json() == {
        "packet_id": pid,
        "claims": [],
        "best_luck": None,
        "claimed_count": 0,
        "claimed_amount": 0,
        "next_cursor": None,
    }
    await client.post(f"/v1/packets/{pid}/grab", headers=bearer("x"))
    r = await client.get(f"/v1/packets/{pid}/claims", headers=bearer("x"))
    assert len(r.json()["claims"]) == 1 and r.json()["best_luck"] is None


async def test_expired_packet_refunds_the_sender(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    packet = await send(client, "alice", total_amount=600, count=3, mode="equal", expires_in=1)
    pid = packet["id"]
    r = await client.post(f"/v1/packets/{pid}/grab", headers=bearer("bob"))
    assert r.status_code == 200 and r.json()["amount"] == 200
    await asyncio.sleep(1.1)
    problem(
        await client.post(f"/v1/packets/{pid}/grab", headers=bearer("carol")),
        410,
        "packet_expired",
    )
    # the same user again still gets their share back
    r = await client.post(f"/v1/packets/{pid}/grab", headers=bearer("bob"))
    assert r.status_code == 200 and r.json()["first"] is False
    assert await eventually(lambda: balance(client, "alice"), 800) == 800
    assert await eventually(lambda: balance(client, "bob"), 200) == 200
    r = await client.get(f"/v1/packets/{pid}", headers=bearer("alice"))
    assert r.json()["status"] == "expired"
    assert (r.json()["remaining_count"], r.json()["remaining_amount"]) == (2, 400)


@pytest.mark.parametrize("pid", [UNKNOWN_PACKET, "not-a-packet-id", "0" * 27])
async def test_packet_not_found(client: httpx.AsyncClient, pid: str) -> None:
    user = bearer("bob")
    problem(await client.get(f"/v1/packets/{pid}", headers=user), 404, "packet_not_found")
    problem(await client.post(f"/v1/packets/{pid}/grab", headers=user), 404, "packet_not_found")
    r = await client.get(f"/v1/packets/{pid}/claims", headers=user)
    problem(r, 404, "packet_not_found")


async def test_insufficient_balance_changes_nothing(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 999)
    r = await client.post(
        "/v1/packets",
        json={"total_amount": 1000, "count": 2, "mode": "lucky"},
        headers=bearer("alice"),
    )
    problem(r, 409, "insufficient_balance")
    assert await balance(client, "alice") == 999
    r = await client.post(
        "/v1/packets",
        json={"total_amount": 10, "count": 2, "mode": "lucky"},
        headers=bearer("pauper"),
    )
    problem(r, 409, "insufficient_balance")


async def test_idempotency_key(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 10_000)
    key = {"Idempotency-Key": "order-42"}
    first = await send(client, "alice", headers=key, total_amount=1000, count=4)
    again = await send(client, "alice", headers=key, total_amount=1000, count=4)
    assert again["id"] == first["id"]
    assert await balance(client, "alice") == 9000
    r = await client.post(
        "/v1/packets",
        json={"total_amount": 1001, "count": 4, "mode": "lucky"},
        headers={**bearer("alice"), **key},
    )
    problem(r, 409, "idempotency_conflict")
    # keys belong to the sender: bob may use the same one
    await deposit(client, "bob", 1000)
    other = await send(client, "bob", headers=key, total_amount=1000, count=4)
    assert other["id"] != first["id"]
    token = bearer("alice")["Authorization"].encode()
    for bad in (b"", b"x" * 129, b"has space", "na\xefve".encode("latin-1")):
        r = await client.post(
            "/v1/packets",
            json={"total_amount": 10, "count": 1, "mode": "lucky"},
            headers={b"Authorization": token, b"Idempotency-Key": bad},
        )
        problem(r, 422, "invalid_request", "Idempotency-Key")
    assert await balance(client, "alice") == 9000


# -- authentication -----------------------------------------------------------------------------


def _tampered() -> str:
    token = hs256("mallory", SECRET)
    head, payload, mac = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["roles"] = ["hongbao:admin"]
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{head}.{forged}.{mac}"


AUTH_CASES = {
    "missing": None,
    "empty": "",
    "not-bearer": "Basic YWRtaW46YWRtaW4=",
    "bearer-without-token": "Bearer ",
    "malformed": "Bearer not.a.token",
    "garbage": "Bearer v1.%%%.###",
    "forged": "Bearer " + hs256("admin", b"some-other-secret-0123456789abcdef", admin=True),
    "tampered": "Bearer " + _tampered(),
    "expired": "Bearer " + hs256("admin", SECRET, admin=True, ttl=60, now=1_000_000),
}


@pytest.mark.parametrize("case", list(AUTH_CASES))
async def test_unauthorized(client: httpx.AsyncClient, case: str) -> None:
    await deposit(client, "alice", 1000)
    pid = (await send(client, "alice", total_amount=100, count=1))["id"]
    value = AUTH_CASES[case]
    headers = {} if value is None else {"Authorization": value}
    calls = [
        ("POST", "/v1/wallets/alice/deposits", {"amount": 5}),
        ("GET", "/v1/wallets/alice", None),
        ("POST", "/v1/packets", {"total_amount": 10, "count": 1, "mode": "lucky"}),
        ("GET", f"/v1/packets/{pid}", None),
        ("POST", f"/v1/packets/{pid}/grab", None),
        ("GET", f"/v1/packets/{pid}/claims", None),
    ]
    for method, path, body in calls:
        r = await client.request(method, path, json=body, headers=headers)
        problem(r, 401, "unauthorized")
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert await balance(client, "alice") == 900
    r = await client.get(f"/v1/packets/{pid}/claims", headers=ADMIN)
    assert r.json()["claims"] == []


# -- bad requests -------------------------------------------------------------------------------

SEND_OK = {"total_amount": 1000, "count": 10, "mode": "lucky"}

BAD_SENDS = [
    pytest.param({**SEND_OK, "total_amount": 10.5}, "total_amount", id="float-amount"),
    pytest.param({**SEND_OK, "total_amount": 1000.0}, "total_amount", id="float-integral"),
    pytest.param({**SEND_OK, "total_amount": True}, "total_amount", id="bool-amount"),
    pytest.param({**SEND_OK, "total_amount": "1000"}, "total_amount", id="string-amount"),
    pytest.param({**SEND_OK, "total_amount": None}, "total_amount", id="null-amount"),
    pytest.param({**SEND_OK, "total_amount": -5}, "total_amount", id="negative-amount"),
    pytest.param({**SEND_OK, "total_amount": 0}, "total_amount", id="zero-amount"),
    pytest.param({**SEND_OK, "total_amount": 10**30}, "total_amount", id="huge-amount"),
    pytest.param({**SEND_OK, "total_amount": 5}, "total_amount", id="below-one-per-share"),
    pytest.param({**SEND_OK, "total_amount": 200_001}, "total_amount", id="above-share-cap"),
    pytest.param({**SEND_OK, "count": 0}, "count", id="count-0"),
    pytest.param({**SEND_OK, "count": -1}, "count", id="count-negative"),
    pytest.param({**SEND_OK, "count": 10_001}, "count", id="count-too-big"),
    pytest.param({**SEND_OK, "count": 2.0}, "count", id="count-float"),
    pytest.param({**SEND_OK, "count": False}, "count", id="count-bool"),
    pytest.param({**SEND_OK, "mode": "random"}, "mode", id="bad-mode"),
    pytest.param({**SEND_OK, "mode": None}, "mode", id="null-mode"),
    pytest.param({**SEND_OK, "expires_in": 0}, "expires_in", id="expires-0"),
    pytest.param({**SEND_OK, "expires_in": 604_801}, "expires_in", id="expires-too-long"),
    pytest.param({**SEND_OK, "expires_in": 60.0}, "expires_in", id="expires-float"),
    pytest.param({**SEND_OK, "greeting": 5}, "greeting", id="greeting-number"),
    pytest.param({**SEND_OK, "greeting": "x" * 201}, "greeting", id="greeting-too-long"),
    pytest.param({**SEND_OK, "greeting": "a\u0000b"}, "greeting", id="greeting-nul"),
    pytest.param({**SEND_OK, "sender_id": "bob"}, "sender_id", id="unknown-field"),
    pytest.param({"count": 10, "mode": "lucky"}, "total_amount", id="missing-amount"),
    pytest.param({"total_amount": 1000, "mode": "lucky"}, "count", id="missing-count"),
    pytest.param({"total_amount": 1000, "count": 10}, "mode", id="missing-mode"),
    pytest.param([SEND_OK], "body", id="array-body"),
    pytest.param("hello", "body", id="string-body"),
]


@pytest.mark.parametrize(("body", "field"), BAD_SENDS)
async def test_send_422_names_the_field(client: httpx.AsyncClient, body: Any, field: str) -> None:
    await deposit(client, "alice", 1_000_000)
    r = await client.post("/v1/packets", json=body, headers=bearer("alice"))
    problem(r, 422, "invalid_request", field)
    assert await balance(client, "alice") == 1_000_000


async def test_send_422_on_a_lone_surrogate(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    raw = b'{"total_amount": 10, "count": 1, "mode": "lucky", "greeting": "\\ud800"}'
    r = await client.post(
        "/v1/packets", content=raw, headers={**bearer("alice"), "content-type": "application/json"}
    )
    problem(r, 422, "invalid_request", "greeting")
    assert await balance(client, "alice") == 1000


BAD_DEPOSITS = [
    pytest.param({"amount": 1.5}, "amount", id="float"),
    pytest.param({"amount": 100.0}, "amount", id="float-integral"),
    pytest.param({"amount": True}, "amount", id="bool"),
    pytest.param({"amount": "100"}, "amount", id="string"),
    pytest.param({"amount": -1}, "amount", id="negative"),
    pytest.param({"amount": 0}, "amount", id="zero"),
    pytest.param({"amount": 10**19}, "amount", id="too-big"),
    pytest.param({}, "amount", id="missing"),
    pytest.param({"amount": 5, "reference": "x"}, "reference", id="unknown-field"),
    pytest.param(None, "body", id="null-body"),
]


@pytest.mark.parametrize(("body", "field"), BAD_DEPOSITS)
async def test_deposit_422_names_the_field(
    client: httpx.AsyncClient, body: Any, field: str
) -> None:
    await deposit(client, "alice", 100)
    r = await client.post(
        "/v1/wallets/alice/deposits",
        content=json.dumps(body),
        headers={**ADMIN, "content-type": "application/json"},
    )
    problem(r, 422, "invalid_request", field)
    assert await balance(client, "alice") == 100


async def test_413_body_too_large(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    big = json.dumps({**SEND_OK, "greeting": "x" * 17_000})
    headers = {**bearer("alice"), "content-type": "application/json"}
    problem(
        await client.post("/v1/packets", content=big, headers=headers), 413, "payload_too_large"
    )

    async def chunked() -> Any:  # no Content-Length: the limit holds while streaming
        for _ in range(40):
            yield b" " * 1024

    r = await client.post("/v1/packets", content=chunked(), headers=headers)
    problem(r, 413, "payload_too_large")
    r = await client.post(
        "/v1/wallets/alice/deposits",
        content=big,
        headers={**ADMIN, "content-type": "application/json"},
    )
    problem(r, 413, "payload_too_large")
    assert await balance(client, "alice") == 1000


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        pytest.param(json.dumps(SEND_OK), None, id="no-content-type"),
        pytest.param(json.dumps(SEND_OK), "text/plain", id="text-plain"),
        pytest.param("total_amount=1000&count=10", "application/x-www-form-urlencoded", id="form"),
    ],
)
async def test_415_not_json(
    client: httpx.AsyncClient, content: str | bytes, content_type: str | None
) -> None:
    await deposit(client, "alice", 10_000)
    headers = bearer("alice")
    if content_type:
        headers["content-type"] = content_type
    r = await client.post("/v1/packets", content=content, headers=headers)
    problem(r, 415, "unsupported_media_type")
    admin = {**ADMIN, **({"content-type": content_type} if content_type else {})}
    r = await client.post("/v1/wallets/alice/deposits", content=content, headers=admin)
    problem(r, 415, "unsupported_media_type")
    assert await balance(client, "alice") == 10_000


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("{not json", id="broken-json"),
        pytest.param("", id="empty-body"),
        pytest.param(b"\xff\xfe\x00", id="not-utf8"),
        pytest.param("[" * 5000 + "]" * 5000, id="deeply-nested"),
        pytest.param('{"amount": ' + "9" * 5000 + "}", id="number-too-long"),
    ],
)
async def test_400_malformed_json(client: httpx.AsyncClient, content: str | bytes) -> None:
    """A body declared JSON that is not: 400 `malformed_json`, saying what is wrong."""
    await deposit(client, "alice", 10_000)
    headers = {**bearer("alice"), "content-type": "application/json"}
    r = await client.post("/v1/packets", content=content, headers=headers)
    body = problem(r, 400, "malformed_json")
    assert body["detail"].startswith("the body is not valid JSON")
    admin = {**ADMIN, "content-type": "application/json"}
    r = await client.post("/v1/wallets/alice/deposits", content=content, headers=admin)
    problem(r, 400, "malformed_json")
    assert await balance(client, "alice") == 10_000


async def test_json_with_charset_is_accepted(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/wallets/alice/deposits",
        content=b'{"amount": 7}',
        headers={**ADMIN, "content-type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 201 and r.json()["balance"] == 7


async def test_bad_requests_leave_packet_and_wallets_unchanged(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 5000)
    packet = await send(client, "alice", total_amount=1000, count=2)
    pid = packet["id"]
    noise = [
        client.post(f"/v1/packets/{pid}/grab"),
        client.post(f"/v1/packets/{pid}/grab", headers={"Authorization": "Bearer x"}),
        client.post(f"/v1/packets/{pid}x/grab", headers=bearer("bob")),
        client.post("/v1/packets", json={**SEND_OK, "count": 0}, headers=bearer("alice")),
        client.post("/v1/packets", content=b"{", headers=bearer("alice")),
        client.post("/v1/wallets/alice/deposits", json={"amount": 5}, headers=bearer("alice")),
        client.delete(f"/v1/packets/{pid}", headers=ADMIN),
        client.put("/v1/wallets/alice", headers=ADMIN),
    ]
    for r in await asyncio.gather(*noise):
        assert 400 <= r.status_code < 500, r.text
    assert await balance(client, "alice") == 4000
    r = await client.get(f"/v1/packets/{pid}", headers=ADMIN)
    assert r.json() == packet
    r = await client.get(f"/v1/packets/{pid}/claims", headers=ADMIN)
    assert r.json()["claims"] == []


# -- routing, operations ------------------------------------------------------------------------


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    problem(await client.get("/v1/nothing", headers=ADMIN), 404, "not_found")
    r = await client.delete("/v1/packets", headers=ADMIN)
    problem(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "POST"


async def test_health_ready_metrics_openapi(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = await client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready"}

    await deposit(client, "alice", 1000)
    pid = (await send(client, "alice", total_amount=100, count=1))["id"]
    await client.post(f"/v1/packets/{pid}/grab", headers=bearer("a"))
    await client.post(f"/v1/packets/{pid}/grab", headers=bearer("a"))
    await client.post(f"/v1/packets/{pid}/grab", headers=bearer("b"))
    await client.post(f"/v1/packets/{UNKNOWN_PACKET}/grab", headers=bearer("b"))
    await client.post(f"/v1/packets/{pid}/grab")
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for outcome in ("granted", "repeat", "exhausted", "not_found", "unauthorized"):
        assert f'hongbao_grabs_total{{outcome="{outcome}"}} 1.0' in text, outcome
    assert "hongbao_grab_seconds_count 5.0" in text
    assert "hongbao_persister_backlog " in text and "hongbao_dead_letters 0.0" in text
    assert "hongbao_settlement_lag_seconds " in text

    r = await client.get("/openapi.json")
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/v1/wallets/{user_id}/deposits",
        "/v1/wallets/{user_id}",
        "/v1/packets",
        "/v1/packets/{packet_id}",
        "/v1/packets/{packet_id}/grab",
        "/v1/packets/{packet_id}/claims",
        "/v1/packets/{packet_id}/cancel",
        "/v1/packets/{packet_id}/events",
        "/v1/packets/{packet_id}/events/ticket",
        "/v1/admin/users/{user_id}/revoke-tokens",
        "/admin/stats",
        "/v1/users/{user_id}/received",
        "/v1/users/{user_id}/sent",
        "/v1/wallets/{user_id}/entries",
        "/v1/admin/statements/{date}",
        "/v1/wallets/{user_id}/withdrawals",
        "/v1/withdrawals",
        "/v1/withdrawals/{withdrawal_id}",
        "/v1/withdrawals/{withdrawal_id}/complete",
        "/v1/withdrawals/{withdrawal_id}/fail",
        "/v1/webhooks",
        "/v1/webhooks/{webhook_id}",
        "/v1/webhooks/{webhook_id}/rotate-secret",
        "/v1/webhooks/{webhook_id}/enable",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    }
    send_schema = doc["components"]["schemas"]["SendRequest"]
    assert send_schema["additionalProperties"] is False
    assert send_schema["properties"]["expires_in"]["maximum"] == 604_800
    assert send_schema["properties"]["count"]["maximum"] == 10_000


async def test_concurrent_grabs_in_process(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 100_000)
    pid = (await send(client, "alice", total_amount=5000, count=20))["id"]
    results = await asyncio.gather(
        *(client.post(f"/v1/packets/{pid}/grab", headers=bearer(f"g{i}")) for i in range(60))
    )
    won = [r.json() for r in results if r.status_code == 200]
    assert len(won) == 20 and all(w["first"] for w in won)
    assert sum(w["amount"] for w in won) == 5000
    assert sorted(w["seq"] for w in won) == list(range(1, 21))
    assert sum(r.status_code == 410 for r in results) == 40


async def test_the_web_apps_json_endpoints_answer_as_documented(client: httpx.AsyncClient) -> None:
    """The client checks every answer against /openapi.json (tests/api/conftest.py)."""
    assert (await client.get("/admin/stats")).status_code == 401
    assert (await client.get("/admin/stats", headers=bearer("alice"))).status_code == 403
    r = await client.get("/admin/stats", headers=ADMIN)
    assert r.status_code == 200 and r.json()["audit"]["ok"] is True, r.text
    missing = "/v1/packets/01zzzzzzzzzzzzzzzzzzzzzzzz/events"
    assert (await client.get(missing)).status_code == 401
    assert (await client.get(missing, params={"token": "forged"})).status_code == 401
    assert (await client.get(missing, headers=bearer("alice"))).status_code == 404


def test_demo_sign_in_is_documented_in_demo_mode_only() -> None:
    from hongbao.api.openapi import build_openapi
    from hongbao.settings import Settings

    assert "/demo/token" not in build_openapi(Settings())["paths"]
    demo = build_openapi(Settings(), demo_mode=True)["paths"]["/demo/token"]["post"]
    assert demo["security"] == [] and set(demo["responses"]) == {
        "201",
        "400",
        "413",
        "415",
        "422",
        "429",
        "503",
    }
