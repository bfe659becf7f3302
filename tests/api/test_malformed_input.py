"""Input the API must refuse with a 4xx problem, never a 500, and without changing
anything: token headers of the wrong JSON type, cursors out of range, HEAD on the paths
with several methods, empty grab bodies, and who learns that a withdrawal exists. Each
runs through the app (in process, and over a real socket where the grab's own paths
differ), on real Redis and each database."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from hongbao.api.schemas import encode_cursor
from hongbao.history import LAST_MICROS, MAX_ROW_ID
from tests.api.conftest import ADMIN, BASE, SECRET, bearer
from tests.api.test_api import balance, deposit, problem, send
from tests.api.test_grab_protocol import Served, _exchange, _request, _serve

pytestmark = [pytest.mark.redis]

UNKNOWN_WITHDRAWAL = "wd_01aaaaaaaaaaaaaaaaaaaaaaaa"


@pytest.fixture
async def served(app: Starlette) -> AsyncIterator[Served]:
    """The app behind uvicorn with hongbao's protocol, on a free loopback port."""
    async for s in _serve(app, []):
        yield s


@pytest.fixture
async def raw_client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app in process that does not check answers against the OpenAPI
    document (which describes no HEAD)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        yield c


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def signed(header: dict[str, Any], user: str = "alice") -> str:
    """A token with this header, signed with the app's secret (HS256): only the header is
    wrong, whatever it is."""
    now = int(time.time())
    head = _b64(json.dumps(header).encode())
    body = _b64(json.dumps({"sub": user, "iat": now, "exp": now + 600}).encode())
    mac = hmac.new(SECRET, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(mac)}"


#: token headers whose alg or kid is not a string, and a crit PyJWT refuses
BAD_HEADERS = [
    {"alg": ["HS256"], "typ": "JWT"},
    {"alg": {"HS256": True}, "typ": "JWT"},
    {"alg": 256, "typ": "JWT"},
    {"alg": "HS256", "kid": ["k"]},
    {"alg": "HS256", "kid": {"k": 1}},
    {"alg": "HS256", "crit": [{"b64": False}]},
]


def unauthorized(r: httpx.Response) -> None:
    problem(r, 401, "unauthorized")
    assert r.headers["www-authenticate"] == 'Bearer realm="hongbao"'


# -- token headers of another JSON type -----------------------------------------------------------


async def test_a_token_header_of_another_json_type_is_a_401(
    client: httpx.AsyncClient, served: Served
) -> None:
    await deposit(client, "alice", 1_000)
    packet = await send(client, "alice", total_amount=300, count=3)
    grab = f"/v1/packets/{packet['id']}/grab"
    # the same token with a string alg is accepted: the header alone is at fault below
    good = {"Authorization": f"Bearer {signed({'alg': 'HS256', 'typ': 'JWT'})}"}
    assert (await client.get("/v1/wallets/alice", headers=good)).status_code == 200
    for header in BAD_HEADERS:
        auth = {"Authorization": f"Bearer {signed(header)}"}
        unauthorized(await client.get("/v1/wallets/alice", headers=auth))
        unauthorized(await client.post(grab, headers=auth))  # the ASGI fast path
        unauthorized(await served.client.post(grab, headers=auth))  # the protocol's path
    r = await client.get(f"/v1/packets/{packet['id']}", headers=ADMIN)
    assert r.json()["remaining_count"] == 3  # no refused grab took a share


# -- HEAD on a path with several methods ----------------------------------------------------------


async def test_head_is_answered_as_get_without_a_body(
    client: httpx.AsyncClient, raw_client: httpx.AsyncClient, served: Served
) -> None:
    r = await client.post(
        "/v1/webhooks",
        json={"url": "http://127.0.0.1:9/hook", "events": ["claim.settled"]},
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    paths = [
        ("/v1/wallets/alice", bearer("alice")),  # a GET route of its own: the reference
        ("/v1/webhooks", ADMIN),
        (f"/v1/webhooks/{r.json()['id']}", ADMIN),
        ("/v1/wallets/alice/withdrawals", bearer("alice")),
    ]
    for path, allowed in paths:
        # the caller's answer, and the refusals: no token (401), another user (403)
        for headers in (allowed, {}, bearer("bob")):
            get = await raw_client.get(path, headers=headers)
            head = await raw_client.head(path, headers=headers)
            assert head.status_code == get.status_code, (path, head.text)
            assert head.headers["content-type"] == get.headers["content-type"]
            # over a socket, as a server answers HEAD: no body
            over_http = await served.client.head(path, headers=headers)
            assert over_http.status_code == get.status_code and over_http.content == b""
    # a method the path lacks is still a 405 naming the path's methods, HEAD among them
    r = await client.put("/v1/webhooks", headers=ADMIN)
    problem(r, 405, "method_not_allowed")
    assert {m.strip() for m in r.headers["allow"].split(",")} == {"GET", "HEAD", "POST"}


# -- cursors out of range -------------------------------------------------------------------------


async def _withdrawal_of_alice(client: httpx.AsyncClient) -> str:
    """A withdrawal of 100 fen alice requested; its id."""
    await deposit(client, "alice", 1_000)
    r = await client.post(
        "/v1/wallets/alice/withdrawals",
        json={"amount": 100},
        headers={**bearer("alice"), "Idempotency-Key": "w1"},
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def test_withdrawal_cursors_out_of_range_are_a_422(client: httpx.AsyncClient) -> None:
    await _withdrawal_of_alice(client)
    lists = [
        ("/v1/wallets/alice/withdrawals", "w", bearer("alice")),
        ("/v1/withdrawals", "ws", ADMIN),
    ]
    for path, tag, headers in lists:
        for at in (LAST_MICROS + 1, 10**20, 2**63, 10**40):
            cursor = encode_cursor(tag, at, UNKNOWN_WITHDRAWAL)
            r = await client.get(path, params={"cursor": cursor}, headers=headers)
            problem(r, 422, "invalid_request", "cursor")
        # the last time a ledger holds is a cursor like any other
        cursor = encode_cursor(tag, LAST_MICROS, UNKNOWN_WITHDRAWAL)
        r = await client.get(path, params={"cursor": cursor}, headers=headers)
        assert r.status_code == 200, r.text
    assert await balance(client, "alice") == 900


async def test_history_and_claims_cursors_out_of_range_are_a_422(
    client: httpx.AsyncClient,
) -> None:
    await deposit(client, "alice", 1_000)
    packet = await send(client, "alice", total_amount=300, count=3)
    bad = [
        ("/v1/users/alice/received", encode_cursor("r", 1_000, MAX_ROW_ID + 1)),
        ("/v1/users/alice/received", encode_cursor("r", 1_000, 10**30)),
        ("/v1/users/alice/received", encode_cursor("r", LAST_MICROS + 1, 1)),
        ("/v1/users/alice/sent", encode_cursor("s", 10**20, packet["id"])),
        ("/v1/wallets/alice/entries", encode_cursor("e", MAX_ROW_ID + 1)),
        ("/v1/wallets/alice/entries", encode_cursor("e", 10**30)),
        (f"/v1/packets/{packet['id']}/claims", encode_cursor(2**63, 1)),
        (f"/v1/packets/{packet['id']}/claims", encode_cursor(1, 10**30)),
    ]
    for path, cursor in bad:
        r = await client.get(path, params={"cursor": cursor}, headers=bearer("alice"))
        problem(r, 422, "invalid_request", "cursor")
    # the largest row id, and the last time, are cursors like any other
    good = [
        ("/v1/users/alice/received", encode_cursor("r", LAST_MICROS, MAX_ROW_ID)),
        ("/v1/wallets/alice/entries", encode_cursor("e", MAX_ROW_ID)),
    ]
    for path, cursor in good:
        r = await client.get(path, params={"cursor": cursor}, headers=bearer("alice"))
        assert r.status_code == 200, r.text
    assert [e["kind"] for e in r.json()["items"]] == ["send", "deposit"]


# -- who learns that a withdrawal exists ----------------------------------------------------------


async def test_another_users_withdrawal_is_a_404_like_an_unknown_one(
    client: httpx.AsyncClient,
) -> None:
    known = await _withdrawal_of_alice(client)
    service_for_bob = {**bearer("payments", service=True), "X-On-Behalf-Of": "bob"}
    for headers in (bearer("bob"), service_for_bob):
        answers = []
        for withdrawal_id in (known, UNKNOWN_WITHDRAWAL):
            r = await client.get(f"/v1/withdrawals/{withdrawal_id}", headers=headers)
            body = problem(r, 404, "withdrawal_not_found")
            answers.append({**body, "detail": body["detail"].replace(withdrawal_id, "…")})
        assert answers[0] == answers[1]  # nothing tells the two apart
    r = await client.get(f"/v1/withdrawals/{known}", headers=bearer("alice"))
    assert r.status_code == 200 and r.json()["id"] == known


# -- a grab whose body is empty -------------------------------------------------------------------


async def test_a_grab_with_an_empty_body_is_a_grab_without_one(
    client: httpx.AsyncClient, served: Served
) -> None:
    await deposit(client, "alice", 1_000)
    packet = await send(client, "alice", total_amount=400, count=4)
    grab = f"/v1/packets/{packet['id']}/grab"
    requests = {
        "u1": _request("POST", grab, "u1", "Content-Length: 0"),
        "u2": _request("POST", grab, "u2", "Content-Length: 00"),
        "u3": _request("POST", grab, "u3", "Transfer-Encoding: chunked") + b"0\r\n\r\n",
    }
    for user, raw in requests.items():
        answers = await _exchange(served.port, raw)
        status, _, body = answers[0]
        assert status == 200, (user, body)
        assert json.loads(body)["user_id"] == user and json.loads(body)["first"] is True

    # in process (the ASGI fast path): a chunked body that is empty
    async def nothing() -> AsyncIterator[bytes]:
        yield b""

    r = await client.post(grab, headers=bearer("u4"), content=nothing())
    assert r.status_code == 200 and r.json()["first"] is True, r.text
