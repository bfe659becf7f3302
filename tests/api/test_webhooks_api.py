"""Webhook endpoints over HTTP: admin only, checked input, and what each call changes in
what a real local receiver gets (every signature checked with `standardwebhooks`)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from hongbao.ledger import SqlLedger
from hongbao.ledger.webhook_store import WebhookStore
from tests.api.conftest import ADMIN, bearer, eventually
from tests.api.serving import run_cli
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.redis, pytest.mark.integration]


async def register(client: httpx.AsyncClient, url: str, events: list[str]) -> dict[str, Any]:
    r = await client.post("/v1/webhooks", json={"url": url, "events": events}, headers=ADMIN)
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def deposit(client: httpx.AsyncClient, user: str, amount: int) -> None:
    r = await client.post(f"/v1/wallets/{user}/deposits", json={"amount": amount}, headers=ADMIN)
    assert r.status_code == 201, r.text


async def arrived(receiver: Receiver, count: int) -> int:
    async def probe() -> int:
        return len(receiver.got)

    return int(await eventually(probe, count))


async def test_only_admins_manage_webhooks(client: httpx.AsyncClient) -> None:
    made = await register(client, "http://127.0.0.1:9/hook", ["claim.settled"])
    alice = bearer("alice")
    calls = [
        ("POST", "/v1/webhooks", {"url": "http://127.0.0.1:9/x", "events": ["claim.settled"]}),
        ("GET", "/v1/webhooks", None),
        ("GET", f"/v1/webhooks/{made['id']}", None),
        ("PATCH", f"/v1/webhooks/{made['id']}", {"batch_size": 5}),
        ("DELETE", f"/v1/webhooks/{made['id']}", None),
        ("POST", f"/v1/webhooks/{made['id']}/rotate-secret", None),
        ("POST", f"/v1/webhooks/{made['id']}/enable", None),
    ]
    for method, path, body in calls:
        r = await client.request(method, path, json=body, headers=alice)
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["code"] == "forbidden"
        r = await client.request(method, path, json=body)
        assert r.status_code == 401
    listed = (await client.get("/v1/webhooks", headers=ADMIN)).json()["webhooks"]
    assert [w["id"] for w in listed] == [made["id"]]


#: a valid registration body
HOOK = {"url": "http://127.0.0.1/hook", "events": ["claim.settled"]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://127.0.0.1/hook", "events": ["claim.settled"]}, "url"),
        ({"url": "not a url", "events": ["claim.settled"]}, "url"),
        ({"url": "http://user:pw@127.0.0.1/hook", "events": ["claim.settled"]}, "url"),
        ({"url": "http:///hook", "events": ["claim.settled"]}, "url"),
        ({"url": "http://127.0.0.1/hook", "events": ["claim.sent"]}, "events"),
        ({"url": "http://127.0.0.1/hook", "events": []}, "events"),
        ({"url": "http://127.0.0.1/hook"}, "events"),
        ({"url": "http://127.0.0.1/hook", "events": ["claim.settled"], "x": 1}, "x"),
        *(({**HOOK, "batch_size": size}, "batch_size") for size in (0, 101, "5", True, 2.5)),
    ],
)
async def test_a_bad_url_event_type_or_batch_size_is_a_422(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    r = await client.post("/v1/webhooks", json=body, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert (problem["code"], problem["field"]) == ("invalid_request", field)
    assert problem["detail"]
    assert (await client.get("/v1/webhooks", headers=ADMIN)).json() == {"webhooks": []}


async def test_a_registered_endpoint_receives_signed_events(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    made = await register(client, receiver.url, ["wallet.deposited"])
    assert made["secret"].startswith("whsec_")
    assert (made["enabled"], made["events"]) == (True, ["wallet.deposited"])
    assert made["batch_size"] == 1
    receiver.secrets = [made["secret"]]
    await deposit(client, "alice", 500)
    assert await arrived(receiver, 1) == 1
    got = receiver.got[0]
    assert got.type == "wallet.deposited"
    assert got.data == {"user_id": "alice", "amount": 500, "balance": 500, "actor": "admin"}
    assert got.id.startswith("evt_") and got.headers["webhook-id"] == got.id
    assert receiver.refused == []
    shown = (await client.get(f"/v1/webhooks/{made['id']}", headers=ADMIN)).json()
    assert "secret" not in shown and shown["url"] == receiver.url
    for missing in (
        await client.get("/v1/webhooks/we_nothing", headers=ADMIN),
        await client.post("/v1/webhooks/we_nothing/enable", headers=ADMIN),
    ):
        assert (missing.status_code, missing.json()["code"]) == (404, "webhook_not_found")


async def test_a_patch_changes_the_batch_size_and_keeps_the_secret(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    made = await register(client, receiver.url, ["wallet.deposited"])
    receiver.secrets = [made["secret"]]
    await deposit(client, "alice", 500)
    assert await arrived(receiver, 1) == 1
    r = await client.patch(f"/v1/webhooks/{made['id']}", json={"batch_size": 10}, headers=ADMIN)
    assert r.status_code == 200, r.text
    changed = r.json()
    assert (changed["id"], changed["batch_size"], changed["events"]) == (
        made["id"],
        10,
        ["wallet.deposited"],
    )
    assert "secret" not in changed
    for n in range(3):
        await deposit(client, "bob", 100 + n)
    assert await arrived(receiver, 4) == 4
    # from then on every message is a batch, still signed with the same secret
    assert receiver.messages[0][0] == receiver.got[0].id
    assert all(m.startswith("msg_") for m, _ in receiver.messages[1:])
    assert [r.data["amount"] for r in receiver.got[1:]] == [100, 101, 102]
    assert receiver.refused == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": None, "url": None}, "body"),
        ({"url": "ftp://127.0.0.1/hook"}, "url"),
        ({"events": []}, "events"),
        ({"events": ["claim.sent"]}, "events"),
        ({"secret": "whsec_x"}, "secret"),
    ],
)
async def test_a_bad_patch_is_a_422_and_changes_nothing(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    made = await register(client, "http://127.0.0.1:9/hook", ["claim.settled"])
    r = await client.patch(f"/v1/webhooks/{made['id']}", json=body, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert (r.json()["code"], r.json()["field"]) == ("invalid_request", field)
    shown = (await client.get(f"/v1/webhooks/{made['id']}", headers=ADMIN)).json()
    assert {k: shown[k] for k in ("url", "events", "batch_size")} == {
        "url": "http://127.0.0.1:9/hook",
        "events": ["claim.settled"],
        "batch_size": 1,
    }
    missing = await client.patch("/v1/webhooks/we_nothing", json={"batch_size": 2}, headers=ADMIN)
    assert (missing.status_code, missing.json()["code"]) == (404, "webhook_not_found")


async def test_after_a_rotation_both_secrets_sign(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    made = await register(client, receiver.url, ["wallet.deposited"])
    r = await client.post(f"/v1/webhooks/{made['id']}/rotate-secret", headers=ADMIN)
    assert r.status_code == 200, r.text
    rotated = r.json()
    assert rotated["secret"] != made["secret"] and rotated["previous_secret_expires_at"]
    receiver.secrets = [made["secret"], rotated["secret"]]
    await deposit(client, "bob", 100)
    assert await arrived(receiver, 1) == 1
    assert receiver.got[0].verified_by == (0, 1)
    assert len(receiver.got[0].headers["webhook-signature"].split(" ")) == 2


async def test_a_deleted_endpoint_gets_nothing_more(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    made = await register(client, receiver.url, ["wallet.deposited"])
    receiver.secrets = [made["secret"]]
    await deposit(client, "carol", 100)
    assert await arrived(receiver, 1) == 1
    r = await client.delete(f"/v1/webhooks/{made['id']}", headers=ADMIN)
    assert r.status_code == 204
    again = await client.delete(f"/v1/webhooks/{made['id']}", headers=ADMIN)
    assert again.status_code == 404
    await deposit(client, "carol", 100)
    await asyncio.sleep(1.0)
    assert len(receiver.got) == 1


async def test_a_receiver_answering_410_disables_its_endpoint(
    receiver: Receiver, client: httpx.AsyncClient
) -> None:
    made = await register(client, receiver.url, ["wallet.deposited"])
    receiver.secrets = [made["secret"]]
    receiver.answer = 410
    await deposit(client, "dave", 100)
    assert await arrived(receiver, 1) == 1

    async def enabled() -> bool:
        shown = (await client.get(f"/v1/webhooks/{made['id']}", headers=ADMIN)).json()
        return bool(shown["enabled"])

    assert await eventually(enabled, False) is False
    shown = (await client.get(f"/v1/webhooks/{made['id']}", headers=ADMIN)).json()
    assert "410" in shown["disabled_reason"]
    await deposit(client, "dave", 100)
    await asyncio.sleep(1.0)
    assert len(receiver.got) == 1


async def test_an_endpoint_enabled_after_a_410_gets_its_parked_events_on_retry_all(
    receiver: Receiver, client: httpx.AsyncClient, ledger: SqlLedger, sql_url: str
) -> None:
    made = await register(client, receiver.url, ["wallet.deposited"])
    receiver.secrets = [made["secret"]]
    store = WebhookStore(ledger)
    # one wallet's deposits wait behind its first, which fails while the receiver is
    # down; back up, the receiver answers that first one 410, once: one disable
    receiver.stop()
    for amount in (100, 200, 300):
        await deposit(client, "erin", amount)

    async def failing() -> int:
        return (await store.stats()).failing

    assert await eventually(failing, 1) == 1
    receiver.answer = 410
    receiver.start()

    async def parked() -> int:
        return (await store.stats()).parked

    assert await eventually(parked, 3) == 3
    shown = (await client.get(f"/v1/webhooks/{made['id']}", headers=ADMIN)).json()
    assert shown["enabled"] is False and "410" in shown["disabled_reason"]
    assert len(receiver.got) == 1

    receiver.answer = 200
    for _ in range(2):  # enabling an enabled endpoint changes nothing
        r = await client.post(f"/v1/webhooks/{made['id']}/enable", headers=ADMIN)
        assert r.status_code == 200, r.text
        enabled = r.json()
        assert (enabled["id"], enabled["enabled"], enabled["disabled_reason"]) == (
            made["id"],
            True,
            None,
        )
        assert "secret" not in enabled
    # enabled, the endpoint gets new events; the parked ones wait for an operator
    await deposit(client, "frank", 5)
    assert await arrived(receiver, 2) == 2
    assert receiver.got[1].data == {"user_id": "frank", "amount": 5, "balance": 5, "actor": "admin"}
    assert (await store.stats()).parked == 3

    # in a thread: the app's dispatcher, on this loop, must go on while the command runs
    done = await asyncio.to_thread(run_cli, "webhooks", "retry-all", "--database-url", sql_url)
    assert done.returncode == 0 and "3 deliveries are due again" in done.stderr, done.stderr
    assert await arrived(receiver, 5) == 5
    assert [r.data["amount"] for r in receiver.got[2:]] == [100, 200, 300]
    assert receiver.got[2].id == receiver.got[0].id  # the same webhook-id as before
    assert receiver.refused == []

    async def delivered() -> int:
        return (await store.stats()).delivered

    assert await eventually(delivered, 4) == 4
    assert (await store.stats()).parked == 0
