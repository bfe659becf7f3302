"""The red-packet record, wallet entries and statements over HTTP, on each database.

Every response is checked against the OpenAPI document by the client fixture."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.api.conftest import ADMIN, bearer, eventually

pytestmark = [pytest.mark.redis]


async def get(client: httpx.AsyncClient, path: str, user: str | None, **params: Any) -> Any:
    headers = ADMIN if user is None else bearer(user)
    r = await client.get(path, headers=headers, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def refused(r: httpx.Response, status: int, code: str, field: str | None = None) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code
    if field is not None:
        assert body["field"] == field


async def packet_grabbed_by(
    client: httpx.AsyncClient, sender: str, total: int, users: list[str]
) -> dict[str, Any]:
    r = await client.post(
        "/v1/packets",
        json={"total_amount": total, "count": len(users), "mode": "lucky", "greeting": "恭喜"},
        headers=bearer(sender),
    )
    assert r.status_code == 201, r.text
    packet: dict[str, Any] = r.json()
    for user in users:
        g = await client.post(f"/v1/packets/{packet['id']}/grab", headers=bearer(user))
        assert g.status_code == 200, g.text
    return packet


async def received_count(client: httpx.AsyncClient, user: str) -> int:
    body = await get(client, f"/v1/users/{user}/received", user)
    count: int = body["totals"]["count"]
    return count


async def test_record_entries_and_who_may_read_them(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/wallets/alice/deposits", json={"amount": 10_000}, headers=ADMIN)
    assert r.status_code == 201
    packets = [
        await packet_grabbed_by(client, "alice", 1000 + i, ["bob", "carol", "dave"])
        for i in range(3)
    ]
    for user in ("bob", "carol", "dave"):
        assert await eventually(lambda u=user: received_count(client, u), 3) == 3

    body = await get(client, "/v1/users/bob/received", "bob", year=datetime.now(UTC).year)
    assert [x["packet_id"] for x in body["items"]] == [p["id"] for p in reversed(packets)]
    assert body["totals"]["count"] == 3
    assert body["totals"]["amount"] == sum(x["amount"] for x in body["items"])
    assert body["next_cursor"] is None and body["as_of"].endswith("Z")
    best_luck = 0
    for item in body["items"]:
        claims = await get(client, f"/v1/packets/{item['packet_id']}/claims", "bob")
        assert item["best_luck"] == (claims["best_luck"] == "bob")
        assert (item["sender_id"], item["greeting"], item["mode"]) == ("alice", "恭喜", "lucky")
        best_luck += item["best_luck"]
    assert body["totals"]["best_luck_count"] == best_luck
    as_admin = await get(client, "/v1/users/bob/received", None)
    assert as_admin | {"as_of": None} == body | {"as_of": None}

    sent = await get(client, "/v1/users/alice/sent", "alice")
    assert sent["totals"] == {"count": 3, "amount": 3003, "refunded": 0}
    assert [p["status"] for p in sent["items"]] == ["exhausted"] * 3
    assert [p["claimed_amount"] for p in sent["items"]] == [1002, 1001, 1000]

    entries = await get(client, "/v1/wallets/alice/entries", "alice")
    assert [(e["kind"], e["amount"], e["balance_after"]) for e in entries["items"]] == [
        ("send", -1002, 6997),
        ("send", -1001, 7999),
        ("send", -1000, 9000),
        ("deposit", 10_000, 10_000),
    ]
    assert entries["balance"] == 6997
    deposits = await get(client, "/v1/wallets/alice/entries", "alice", kind="deposit")
    assert [e["balance_after"] for e in deposits["items"]] == [10_000]

    # another user's record is not yours to read; no token is a 401
    for path in ("/v1/users/bob/received", "/v1/users/bob/sent", "/v1/wallets/bob/entries"):
        refused(await client.get(path, headers=bearer("carol")), 403, "forbidden")
        refused(await client.get(path), 401, "unauthorized")


async def test_pages_follow_the_cursor(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/wallets/ann/deposits", json={"amount": 10_000}, headers=ADMIN)
    assert r.status_code == 201
    made = [await packet_grabbed_by(client, "ann", 10, ["ben"]) for _ in range(5)]
    assert await eventually(lambda: received_count(client, "ben"), 5) == 5
    for path, user in [
        ("/v1/users/ben/received", "ben"),
        ("/v1/users/ann/sent", "ann"),
        ("/v1/wallets/ben/entries", "ben"),
    ]:
        key = "reference" if "entries" in path else "packet_id"
        whole = [x[key] for x in (await get(client, path, user, limit=500))["items"]]
        seen: list[str] = []
        params: dict[str, Any] = {"limit": 2, "cursor": ""}
        while True:
            body = await get(client, path, user, **params)
            seen += [x[key] for x in body["items"]]
            if body["next_cursor"] is None:
                break
            params["cursor"] = body["next_cursor"]
        assert seen == whole and len(seen) == 5, path
    # newest grab first (entries come in the order the persister applied them)
    received = (await get(client, "/v1/users/ben/received", "ben"))["items"]
    assert {x["packet_id"] for x in received} == {p["id"] for p in made}
    times = [x["claimed_at"] for x in received]
    assert times == sorted(times, reverse=True)
    cursor = (await get(client, "/v1/users/ann/sent", "ann", limit=1))["next_cursor"]
    # a cursor of another endpoint is refused, as is one changed by hand
    refused(
        await client.get(f"/v1/users/ben/received?cursor={cursor}", headers=bearer("ben")),
        422,
        "invalid_request",
        "cursor",
    )
    refused(
        await client.get(f"/v1/users/ann/sent?cursor={cursor[:-2]}", headers=bearer("ann")),
        422,
        "invalid_request",
        "cursor",
    )


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/users/bob/received?limit=0", "limit"),
        ("/v1/users/bob/received?limit=501", "limit"),
        ("/v1/users/bob/received?limit=ten", "limit"),
        ("/v1/users/bob/received?year=1969", "year"),
        ("/v1/users/bob/sent?year=２０２６", "year"),
        ("/v1/users/bob/sent?cursor=***", "cursor"),
        ("/v1/users/bob/received?cursor=eA", "cursor"),
        ("/v1/wallets/bob/entries?kind=gift", "kind"),
        ("/v1/wallets/bob/entries?kind=", "kind"),
        ("/v1/users/bob/received?year=", "year"),
        ("/v1/wallets/bob/entries?limit=-1", "limit"),
        ("/v1/users/b%20b/received", "user_id"),
        ("/v1/admin/statements/2026-13-01", "date"),
        ("/v1/admin/statements/20261126", "date"),
    ],
)
async def test_bad_parameters_name_their_field(
    client: httpx.AsyncClient, path: str, field: str
) -> None:
    refused(await client.get(path, headers=ADMIN), 422, "invalid_request", field)


async def test_the_statement_of_today_is_for_admins_and_adds_up(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/v1/wallets/eve/deposits", json={"amount": 500}, headers=ADMIN)
    assert r.status_code == 201
    await packet_grabbed_by(client, "eve", 300, ["fay", "gus"])
    for user in ("fay", "gus"):
        assert await eventually(lambda u=user: received_count(client, u), 1) == 1
    today = datetime.now(UTC).date().isoformat()
    refused(
        await client.get(f"/v1/admin/statements/{today}", headers=bearer("eve")), 403, "forbidden"
    )
    body = await get(client, f"/v1/admin/statements/{today}", None)
    assert body["date"] == today and body["balanced"] is True and body["difference"] == 0
    assert body["start_balance"] == 0 and body["end_balance"] == 500
    assert {t["kind"]: (t["count"], t["amount"]) for t in body["totals"]} == {
        "deposit": (1, 500),
        "send": (1, -300),
        "claim": (2, 300),
    }
    assert [e["wallet"] for e in body["entries"][:2]] == ["eve", "eve"]
    assert sum(e["amount"] for e in body["entries"]) == body["entries_total"] == 500
