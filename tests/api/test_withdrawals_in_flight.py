"""GET /v1/withdrawals over HTTP: every user's withdrawals in one status, oldest first,
for admins only; bad parameters (422, nothing listed); pages; and the gauge of the
oldest withdrawal still requested."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from hongbao.ledger import SqlLedger
from hongbao.withdrawals import MAX_OLDER_THAN
from tests.api.conftest import ADMIN, bearer
from tests.api.test_api import deposit, problem
from tests.api.test_withdrawals import SERVICE, made, report
from tests.ledger.test_withdrawals_by_status import requested_at

pytestmark = [pytest.mark.redis]

OLDEST_GAUGE = "hongbao_withdrawals_oldest_requested_seconds"


async def listed(client: httpx.AsyncClient, query: str = "") -> dict[str, Any]:
    r = await client.get(f"/v1/withdrawals{query}", headers=ADMIN)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def three_users(client: httpx.AsyncClient, ledger: SqlLedger) -> list[dict[str, Any]]:
    """Six requested withdrawals of three users, made 6 hours to 1 hour ago, newest
    first in request order (so that the list's order is not the order made)."""
    for user in ("alice", "bob", "carol"):
        await deposit(client, user, 1000)
    now = datetime.now(UTC)
    out = []
    for i in range(6):
        w = await made(client, ("alice", "bob", "carol")[i % 3], 10 + i, f"w{i}")
        await requested_at(ledger, w["id"], now - timedelta(hours=i + 1))
        r = await client.get(f"/v1/withdrawals/{w['id']}", headers=ADMIN)
        out.append(r.json())
    return out


async def test_only_an_admin_lists_them(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    w = await made(client, "alice", 100, "w1")
    body = await listed(client)
    assert body == {"status": "requested", "items": [w], "next_cursor": None}
    for_alice = {**SERVICE, "X-On-Behalf-Of": "alice"}
    for headers in (bearer("alice"), SERVICE, for_alice):
        problem(await client.get("/v1/withdrawals", headers=headers), 403, "forbidden")
        # the permission is checked before the parameters
        r = await client.get("/v1/withdrawals?status=lost", headers=headers)
        problem(r, 403, "forbidden")
    problem(await client.get("/v1/withdrawals"), 401, "unauthorized")
    r = await client.post("/v1/withdrawals", headers=ADMIN)
    problem(r, 405, "method_not_allowed")


async def test_oldest_first_across_users_by_status_and_age(
    client: httpx.AsyncClient, ledger: SqlLedger
) -> None:
    made_ = await three_users(client, ledger)
    oldest_first = [w["id"] for w in reversed(made_)]
    body = await listed(client)
    assert [w["id"] for w in body["items"]] == oldest_first and body["next_cursor"] is None
    assert {w["user_id"] for w in body["items"]} == {"alice", "bob", "carol"}
    assert body["items"][0] == made_[-1]
    # requested at least 3.5 hours ago: made 6, 5 and 4 hours ago
    assert [w["id"] for w in (await listed(client, "?older_than=12600"))["items"]] == (
        oldest_first[:3]
    )
    assert (await listed(client, f"?older_than={MAX_OLDER_THAN}"))["items"] == []
    assert len((await listed(client, "?older_than=0"))["items"]) == 6

    await report(client, made_[0]["id"], "complete")
    await report(client, made_[5]["id"], "fail")
    body = await listed(client, "?status=requested")
    assert [w["id"] for w in body["items"]] == oldest_first[1:5]
    body = await listed(client, "?status=failed")
    assert body["status"] == "failed" and [w["id"] for w in body["items"]] == [made_[5]["id"]]
    assert body["items"][0]["status"] == "failed"
    body = await listed(client, "?status=completed&older_than=1800")
    assert [w["id"] for w in body["items"]] == [made_[0]["id"]]


@pytest.mark.parametrize("limit", [1, 2, 5])
async def test_a_page_at_a_time(client: httpx.AsyncClient, ledger: SqlLedger, limit: int) -> None:
    made_ = await three_users(client, ledger)
    seen: list[str] = []
    query = f"?limit={limit}"
    while True:
        body = await listed(client, query)
        seen.extend(w["id"] for w in body["items"])
        if body["next_cursor"] is None:
            break
        assert len(body["items"]) == limit
        query = f"?limit={limit}&cursor={body['next_cursor']}"
    assert seen == [w["id"] for w in reversed(made_)]


async def test_bad_parameters_are_422s(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    await made(client, "alice", 100, "w1")
    await made(client, "alice", 100, "w2")
    wallet_cursor = (
        await client.get("/v1/wallets/alice/withdrawals?limit=1", headers=ADMIN)
    ).json()["next_cursor"]
    assert wallet_cursor is not None
    for query, field in (
        ("status=lost", "status"),
        ("status=", "status"),
        ("status=REQUESTED", "status"),
        ("older_than=-1", "older_than"),
        ("older_than=", "older_than"),
        ("older_than=1.5", "older_than"),
        ("older_than=1h", "older_than"),
        (f"older_than={MAX_OLDER_THAN + 1}", "older_than"),
        ("older_than=" + "9" * 5000, "older_than"),
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=ten", "limit"),
        ("cursor=nonsense", "cursor"),
        # a cursor of a wallet's list (newest first) is not one of this list
        (f"cursor={wallet_cursor}", "cursor"),
    ):
        r = await client.get(f"/v1/withdrawals?{query}", headers=ADMIN)
        body = problem(r, 422, "invalid_request", field)
        assert field in body["detail"], body
    assert len((await listed(client, "?limit=200"))["items"]) == 2


async def oldest_gauge(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    values = [line.split()[1] for line in text.splitlines() if line.startswith(OLDEST_GAUGE)]
    assert len(values) == 1, text
    return float(values[0])


async def test_the_oldest_requested_gauge(client: httpx.AsyncClient, ledger: SqlLedger) -> None:
    assert await oldest_gauge(client) == 0.0
    await deposit(client, "alice", 1000)
    w = await made(client, "alice", 100, "w1")
    assert 0.0 < await oldest_gauge(client) < 30
    await requested_at(ledger, w["id"], datetime.now(UTC) - timedelta(hours=2))
    assert await oldest_gauge(client) == pytest.approx(7200, abs=30)
    r = await report(client, w["id"], "complete")
    assert r.status_code == 200, r.text
    assert await oldest_gauge(client) == 0.0
