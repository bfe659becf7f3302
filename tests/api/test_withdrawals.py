"""Withdrawals over HTTP: who may do what, what is refused (and changes nothing),
idempotency, the outcomes, the list, and the entries and statement that show them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.api.conftest import ADMIN, bearer
from tests.api.test_api import balance, deposit, problem

pytestmark = [pytest.mark.redis]

SERVICE = bearer("payments", service=True)
UNKNOWN = "wd_01aaaaaaaaaaaaaaaaaaaaaaaa"


def key(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


async def withdraw(
    client: httpx.AsyncClient,
    user: str,
    amount: Any,
    idempotency_key: str = "w1",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return await client.post(
        f"/v1/wallets/{user}/withdrawals",
        json={"amount": amount},
        headers={**(bearer(user) if headers is None else headers), **key(idempotency_key)},
    )


async def made(client: httpx.AsyncClient, user: str, amount: int, idem: str) -> dict[str, Any]:
    r = await withdraw(client, user, amount, idem)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


async def report(
    client: httpx.AsyncClient,
    withdrawal_id: str,
    outcome: str,
    headers: dict[str, str] = SERVICE,
    **body: Any,
) -> httpx.Response:
    return await client.post(
        f"/v1/withdrawals/{withdrawal_id}/{outcome}", json=body or None, headers=headers
    )


# -- who may ----------------------------------------------------------------------------------


async def test_the_owner_a_service_for_them_or_an_admin_may_withdraw(
    client: httpx.AsyncClient,
) -> None:
    await deposit(client, "alice", 1000)
    r = await withdraw(client, "alice", 100, "by-alice")
    assert r.status_code == 201, r.text
    w = r.json()
    assert w["user_id"] == "alice" and w["amount"] == 100 and w["status"] == "requested"
    assert w["id"].startswith("wd_") and w["note"] is None
    assert w["created_at"] == w["updated_at"]
    for_alice = {**SERVICE, "X-On-Behalf-Of": "alice"}
    r = await withdraw(client, "alice", 100, "by-service", headers=for_alice)
    assert r.status_code == 201, r.text
    r = await withdraw(client, "alice", 100, "by-admin", headers=ADMIN)
    assert r.status_code == 201, r.text
    # someone else, a service acting for someone else or for nobody, no token
    for headers in (bearer("bob"), {**SERVICE, "X-On-Behalf-Of": "bob"}, SERVICE):
        problem(await withdraw(client, "alice", 100, "other", headers=headers), 403, "forbidden")
    problem(await withdraw(client, "alice", 100, "other", headers={}), 401, "unauthorized")
    assert await balance(client, "alice") == 700
    entries = await client.get("/v1/wallets/alice/entries?kind=withdrawal", headers=ADMIN)
    assert len(entries.json()["items"]) == 3


async def test_who_may_read_a_withdrawal(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    w = await made(client, "alice", 100, "w1")
    path = f"/v1/withdrawals/{w['id']}"
    for headers in (bearer("alice"), SERVICE, ADMIN, {**SERVICE, "X-On-Behalf-Of": "alice"}):
        r = await client.get(path, headers=headers)
        assert r.status_code == 200 and r.json() == w
    # anyone else gets the answer of an unknown id (tests/api/test_malformed_input.py)
    problem(await client.get(path, headers=bearer("bob")), 404, "withdrawal_not_found")
    r = await client.get(path, headers={**SERVICE, "X-On-Behalf-Of": "bob"})
    problem(r, 404, "withdrawal_not_found")
    problem(await client.get(path), 401, "unauthorized")
    r = await client.get("/v1/wallets/alice/withdrawals", headers=bearer("bob"))
    problem(r, 403, "forbidden")
    r = await client.get("/v1/wallets/alice/withdrawals", headers=ADMIN)
    assert r.status_code == 200 and r.json()["items"] == [w]


async def test_only_a_service_or_an_admin_reports_the_outcome(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    one = await made(client, "alice", 100, "w1")
    two = await made(client, "alice", 200, "w2")
    for outcome in ("complete", "fail"):
        for headers in (bearer("alice"), bearer("bob"), {**SERVICE, "X-On-Behalf-Of": "alice"}):
            problem(await report(client, one["id"], outcome, headers), 403, "forbidden")
        problem(await report(client, one["id"], outcome, {}), 401, "unauthorized")
    assert await balance(client, "alice") == 700
    r = await report(client, one["id"], "complete", SERVICE)
    assert r.status_code == 200 and r.json()["status"] == "completed"
    r = await report(client, two["id"], "fail", ADMIN)
    assert r.status_code == 200 and r.json()["status"] == "failed"
    assert await balance(client, "alice") == 900


# -- refusals change nothing ------------------------------------------------------------------


async def test_bad_requests_are_refused(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    for amount in (0, -1, 1.5, 100.0, "100", None, True, 10_000_000_001):
        problem(await withdraw(client, "alice", amount), 422, "invalid_request", "amount")
    r = await client.post(
        "/v1/wallets/alice/withdrawals", json={}, headers={**bearer("alice"), **key("k")}
    )
    problem(r, 422, "invalid_request", "amount")
    r = await client.post(
        "/v1/wallets/alice/withdrawals",
        json={"amount": 10, "to": "bank"},
        headers={**bearer("alice"), **key("k")},
    )
    problem(r, 422, "invalid_request", "to")
    r = await client.post(
        "/v1/wallets/alice/withdrawals", json={"amount": 10}, headers=bearer("alice")
    )
    problem(r, 422, "invalid_request", "Idempotency-Key")
    problem(
        await withdraw(client, "alice", 10, "k" * 129), 422, "invalid_request", "Idempotency-Key"
    )
    r = await client.post(
        "/v1/wallets/alice/withdrawals",
        content=b"amount=10",
        headers={
            **bearer("alice"),
            **key("k"),
            "Content-Type": "application/x-www-form-urlencoded",
        },
    )
    problem(r, 415, "unsupported_media_type")
    r = await client.post(
        "/v1/wallets/alice/withdrawals",
        content=b"{",
        headers={**bearer("alice"), **key("k"), "Content-Type": "application/json"},
    )
    problem(r, 400, "malformed_json")
    bad_user = "x" * 65
    problem(await withdraw(client, bad_user, 10, headers=ADMIN), 422, "invalid_request", "user_id")
    problem(await withdraw(client, "alice", 1001), 409, "insufficient_balance")
    problem(await withdraw(client, "nobody", 1), 409, "insufficient_balance")
    assert await balance(client, "alice") == 1000
    r = await client.get("/v1/wallets/alice/withdrawals", headers=bearer("alice"))
    assert r.json()["items"] == []


async def test_unknown_withdrawals(client: httpx.AsyncClient) -> None:
    for withdrawal_id in (UNKNOWN, "wd_x", "01aaaaaaaaaaaaaaaaaaaaaaaa"):
        problem(
            await client.get(f"/v1/withdrawals/{withdrawal_id}", headers=ADMIN),
            404,
            "withdrawal_not_found",
        )
        for outcome in ("complete", "fail"):
            problem(await report(client, withdrawal_id, outcome), 404, "withdrawal_not_found")


async def test_bad_outcome_bodies_change_nothing(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    w = await made(client, "alice", 100, "w1")
    for body in ({"note": "x" * 201}, {"note": "a\u202eb"}, {"note": 5}, {"reason": "x"}):
        field = "note" if "note" in body else "reason"
        problem(await report(client, w["id"], "fail", **body), 422, "invalid_request", field)
    r = await client.post(
        f"/v1/withdrawals/{w['id']}/fail",
        content=b"note",
        headers={**SERVICE, "Content-Type": "text/plain"},
    )
    problem(r, 415, "unsupported_media_type")
    r = await client.get(f"/v1/withdrawals/{w['id']}", headers=ADMIN)
    assert r.json()["status"] == "requested"
    assert await balance(client, "alice") == 900


# -- idempotency and outcomes -----------------------------------------------------------------


async def test_same_key_same_withdrawal(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    first = await made(client, "alice", 300, "payout-7")
    again = await made(client, "alice", 300, "payout-7")
    assert again == first
    problem(await withdraw(client, "alice", 301, "payout-7"), 409, "idempotency_conflict")
    assert await balance(client, "alice") == 700
    # racing retries of one key
    got = await asyncio.gather(*(withdraw(client, "alice", 100, "payout-8") for _ in range(10)))
    assert {r.status_code for r in got} == {201}
    assert len({r.json()["id"] for r in got}) == 1
    assert await balance(client, "alice") == 600


async def test_complete_and_fail(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    paid = await made(client, "alice", 300, "w1")
    bounced = await made(client, "alice", 200, "w2")
    assert await balance(client, "alice") == 500

    r = await report(client, paid["id"], "complete", note="bank ref 42")
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["status"] == "completed" and done["note"] == "bank ref 42"
    r = await report(client, paid["id"], "complete")  # again, without a body
    assert r.status_code == 200 and r.json() == done
    problem(await report(client, paid["id"], "fail"), 409, "withdrawal_already_completed")

    r = await report(client, bounced["id"], "fail", note="account closed")
    assert r.status_code == 200 and r.json()["status"] == "failed"
    r = await report(client, bounced["id"], "fail", note="account closed")
    assert r.status_code == 200 and r.json()["note"] == "account closed"
    problem(await report(client, bounced["id"], "complete"), 409, "withdrawal_already_failed")
    assert await balance(client, "alice") == 700

    entries = (await client.get("/v1/wallets/alice/entries", headers=bearer("alice"))).json()
    assert [
        (e["kind"], e["amount"], e["balance_after"], e.get("withdrawal_id"))
        for e in entries["items"]
    ] == [
        ("reversal", 200, 700, bounced["id"]),
        ("withdrawal", -200, 500, bounced["id"]),
        ("withdrawal", -300, 700, paid["id"]),
        ("deposit", 1000, 1000, None),
    ]
    today = datetime.now(UTC).date().isoformat()
    statement = (await client.get(f"/v1/admin/statements/{today}", headers=ADMIN)).json()
    totals = {t["kind"]: (t["count"], t["amount"]) for t in statement["totals"]}
    assert totals["withdrawal"] == (2, -500) and totals["reversal"] == (1, 200)
    assert statement["balanced"]


async def test_racing_outcomes_one_wins(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    w = await made(client, "alice", 300, "w1")
    got = await asyncio.gather(
        *(report(client, w["id"], "fail" if i % 2 else "complete") for i in range(10))
    )
    final = (await client.get(f"/v1/withdrawals/{w['id']}", headers=ADMIN)).json()["status"]
    winner, loser = ("fail", "complete") if final == "failed" else ("complete", "fail")
    for i, r in enumerate(got):
        asked = "fail" if i % 2 else "complete"
        if asked == winner:
            assert r.status_code == 200 and r.json()["status"] == final
        else:
            problem(r, 409, f"withdrawal_already_{final}")
    assert loser != winner
    assert await balance(client, "alice") == (1000 if final == "failed" else 700)


# -- the list ---------------------------------------------------------------------------------


async def test_a_wallets_withdrawals_a_page_at_a_time(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    ids = [(await made(client, "alice", 10 + i, f"w{i}"))["id"] for i in range(5)]
    await report(client, ids[1], "fail")
    seen: list[str] = []
    path = "/v1/wallets/alice/withdrawals?limit=2"
    while True:
        r = await client.get(path, headers=bearer("alice"))
        assert r.status_code == 200, r.text
        body = r.json()
        seen.extend(w["id"] for w in body["items"])
        if body["next_cursor"] is None:
            break
        path = f"/v1/wallets/alice/withdrawals?limit=2&cursor={body['next_cursor']}"
    assert sorted(seen, reverse=True) == seen and sorted(seen) == sorted(ids)
    r = await client.get("/v1/wallets/alice/withdrawals?status=failed", headers=bearer("alice"))
    assert [w["id"] for w in r.json()["items"]] == [ids[1]]
    for query, field in (
        ("status=lost", "status"),
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=" + "9" * 5000, "limit"),
        ("cursor=nonsense", "cursor"),
    ):
        r = await client.get(f"/v1/wallets/alice/withdrawals?{query}", headers=bearer("alice"))
        problem(r, 422, "invalid_request", field)


async def test_metrics_count_withdrawals_by_outcome(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    ids = [(await made(client, "alice", 100 * (i + 1), f"w{i}"))["id"] for i in range(3)]
    await report(client, ids[1], "complete")
    await report(client, ids[2], "fail")
    await report(client, ids[2], "fail")  # a repeat counts once
    text = (await client.get("/metrics")).text
    counters = ("hongbao_withdrawals_total", "hongbao_withdrawals_fen_total")
    lines = {line for line in text.splitlines() if line.startswith(counters)}
    assert lines == {
        'hongbao_withdrawals_total{outcome="requested"} 3.0',
        'hongbao_withdrawals_total{outcome="completed"} 1.0',
        'hongbao_withdrawals_total{outcome="failed"} 1.0',
        'hongbao_withdrawals_fen_total{outcome="requested"} 600.0',
        'hongbao_withdrawals_fen_total{outcome="completed"} 200.0',
        'hongbao_withdrawals_fen_total{outcome="failed"} 300.0',
    }


async def test_a_wrong_method_names_both_of_the_wallets_withdrawals(
    client: httpx.AsyncClient,
) -> None:
    r = await client.delete("/v1/wallets/alice/withdrawals", headers=bearer("alice"))
    problem(r, 405, "method_not_allowed")
    assert {"GET", "POST"} <= {m.strip() for m in r.headers["allow"].split(",")}
