"""`GrabProtocol` over a real socket: plain grabs are answered from the parser exactly as
the app answers them, and every other request still reaches the app through uvicorn."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from hongbao.app import create_app
from hongbao.ledger import SqlLedger
from hongbao.serving.grab_protocol import GrabProtocol
from hongbao.serving.workers import uvicorn_options
from hongbao.settings import Settings
from hongbao.storage import RedisStore
from tests.api.conftest import SECRET, bearer
from tests.api.test_api import deposit, send
from tests.api.test_fastpath import grabs_answer_alike


class CountingApp:
    """Counts the HTTP requests that reach the ASGI app (a grab answered by the protocol
    does not); `GrabProtocol` finds the hongbao app under it through `.app`, as under
    uvicorn's own wrappers."""

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.requests: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.requests.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


@dataclass
class Served:
    app: CountingApp
    port: int
    client: httpx.AsyncClient


async def _serve(
    app: Starlette, trusted_proxies: list[str], access_log: bool = False
) -> AsyncIterator[Served]:
    """`app` (its lifespan already running) served by uvicorn with hongbao's options on a
    free loopback port, in this event loop."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    counting = CountingApp(app)
    options = uvicorn_options("127.0.0.1", port, "info", access_log, trusted_proxies)
    assert options["http"] is GrabProtocol
    config = uvicorn.Config(counting, **{**options, "lifespan": "off"})
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            yield Served(counting, port, client)
    finally:
        await server.shutdown()
        sock.close()


@pytest.fixture
async def served(app: Starlette) -> AsyncIterator[Served]:
    async for s in _serve(app, []):
        yield s


@pytest.fixture
async def asgi(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the same app in process: grabs go through the ASGI fast path."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://hongbao.test") as c:
        yield c


async def _packet(asgi: httpx.AsyncClient) -> dict[str, Any]:
    """A packet of 3 shares, sent in process."""
    await deposit(asgi, "alice", 1_000)
    return await send(asgi, "alice", total_amount=300, count=3)


def _same(protocol: httpx.Response, app: httpx.Response) -> None:
    assert protocol.status_code == app.status_code
    # all headers, in order, but the date a running server adds
    served = [(name, value) for name, value in protocol.headers.multi_items() if name != "date"]
    assert served == app.headers.multi_items()
    assert protocol.json() == app.json()


async def test_plain_grabs_are_answered_as_the_app_answers_them(
    served: Served, asgi: httpx.AsyncClient
) -> None:
    await grabs_answer_alike(served.client, asgi, _same)
    # none of the grabs sent over HTTP reached the ASGI app
    assert served.app.requests == ["POST /v1/wallets/alice/deposits", "POST /v1/packets"]


async def test_other_requests_reach_the_app(served: Served, asgi: httpx.AsyncClient) -> None:
    packet = await _packet(asgi)
    grab = f"/v1/packets/{packet['id']}/grab"
    http = served.client

    assert (await http.get("/healthz")).status_code == 200
    assert (await http.get(grab, headers=bearer("u1"))).status_code == 405
    # a body, a query and an escaped path go the app's way, and are answered alike
    r = await http.post(grab, headers=bearer("u1"), json={})
    assert r.status_code == 200 and r.json()["first"] is True
    r = await http.post(grab + "?x=1", headers=bearer("u2"))
    assert r.status_code == 200 and r.json()["first"] is True
    escaped = f"/v1/packets/{packet['id'][:-1]}%{ord(packet['id'][-1]):02X}/grab"
    r = await http.post(escaped, headers=bearer("u3"))
    assert r.status_code == 200 and r.json()["first"] is True
    assert served.app.requests == [
        "GET /healthz",
        f"GET {grab}",
        f"POST {grab}",
        f"POST {grab}",
        f"POST {grab}",
    ]


async def _exchange(port: int, raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Write `raw` at once on a new connection; read responses until the server closes
    it, or none comes for a second."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answers: list[tuple[int, dict[str, str], bytes]] = []
    try:
        while True:
            try:
                status_line = await asyncio.wait_for(reader.readline(), 1.0)
            except TimeoutError:
                break
            if not status_line:
                answers.append((0, {}, b""))  # closed by the server
                break
            headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            answers.append((int(status_line.split()[1]), headers, body))
    finally:
        writer.close()
    return answers


def _request(method: str, path: str, user: str | None, *extra: str, version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: hongbao.test"]
    if user is not None:
        lines.append(f"Authorization: {bearer(user)['Authorization']}")
    lines.extend(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_pipelined_requests_are_answered_in_order(
    served: Served, asgi: httpx.AsyncClient
) -> None:
    packet = await _packet(asgi)
    grab = f"/v1/packets/{packet['id']}/grab"
    raw = (
        _request("POST", grab, "u1")
        + _request("GET", "/healthz", None)
        + _request("POST", grab, "u2")
        + _request("POST", grab, "u1")
    )
    answers = await _exchange(served.port, raw)
    assert [status for status, _, _ in answers] == [200, 200, 200, 200]
    bodies = [json.loads(body) for _, _, body in answers]
    assert bodies[1] == {"status": "ok"}
    assert [bodies[i]["first"] for i in (0, 2, 3)] == [True, True, False]
    assert bodies[3]["amount"] == bodies[0]["amount"]
    # the first grab was answered by the protocol; those behind a request in flight
    # waited in uvicorn's pipeline and went the app's way
    assert served.app.requests[0] == "GET /healthz"


async def test_connection_close_and_http_1_0(served: Served, asgi: httpx.AsyncClient) -> None:
    packet = await _packet(asgi)
    grab = f"/v1/packets/{packet['id']}/grab"

    answers = await _exchange(served.port, _request("POST", grab, "u1", "Connection: close"))
    assert [a[0] for a in answers] == [200, 0]  # answered, then closed by the server
    assert answers[0][1]["connection"] == "close"
    assert served.app.requests == []

    answers = await _exchange(served.port, _request("POST", grab, "u2", version="1.0"))
    assert [a[0] for a in answers] == [200, 0]
    assert json.loads(answers[0][2])["first"] is True
    assert served.app.requests == [f"POST {grab}"]  # HTTP/1.0 goes the app's way


async def test_a_grab_whose_client_left_still_counts(
    served: Served, asgi: httpx.AsyncClient
) -> None:
    packet = await _packet(asgi)
    grab = f"/v1/packets/{packet['id']}/grab"
    _, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(_request("POST", grab, "gone"))
    await writer.drain()
    writer.close()
    # the share it took is its own: the same user again gets it back, not a new one
    for _ in range(100):
        r = await served.client.get(f"/v1/packets/{packet['id']}", headers=bearer("alice"))
        if r.json()["remaining_count"] == 2:
            break
        await asyncio.sleep(0.02)
    assert r.json()["remaining_count"] == 2
    again = await served.client.post(grab, headers=bearer("gone"))
    assert again.status_code == 200 and again.json()["first"] is False


async def test_trusted_proxies_name_the_client_for_the_address_limit(
    settings: Settings, store: RedisStore, ledger: SqlLedger
) -> None:
    limited = replace(settings, rate_limit_ip=1.0, rate_limit_burst=1)
    app = create_app(limited, SECRET, run_workers=False)
    async with app.router.lifespan_context(app):
        async for s in _serve(app, ["127.0.0.1"]):
            await deposit(s.client, "alice", 1_000)
            packet = await send(s.client, "alice", total_amount=300, count=3)
            grab = f"/v1/packets/{packet['id']}/grab"

            def through(ip: str, user: str) -> dict[str, Any]:
                return {"X-Forwarded-For": ip, **bearer(user)}

            assert (await s.client.post(grab, headers=through("10.0.0.1", "u1"))).status_code == 200
            # the same forwarded address again: over its rate
            r = await s.client.post(grab, headers=through("10.0.0.1", "u2"))
            assert r.status_code == 429 and r.json()["code"] == "rate_limited"
            # another forwarded address, from the same proxy: its own rate
            assert (await s.client.post(grab, headers=through("10.0.0.2", "u2"))).status_code == 200
            assert not any("grab" in request for request in s.app.requests)


async def test_the_access_log_has_a_line_for_each_grab(
    app: Starlette, asgi: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    packet = await _packet(asgi)
    grab = f"/v1/packets/{packet['id']}/grab"
    access = logging.getLogger("uvicorn.access")  # uvicorn's config stops its propagation
    async for s in _serve(app, [], access_log=True):
        access.addHandler(caplog.handler)
        try:
            assert (await s.client.post(grab, headers=bearer("u1"))).status_code == 200
            assert (await s.client.post(grab)).status_code == 401
        finally:
            access.removeHandler(caplog.handler)
        assert s.app.requests == []
    records = [r for r in caplog.records if r.name == "uvicorn.access"]
    assert len(records) == 2
    lines = [logging.getLogger("uvicorn.access").handlers[0].format(r) for r in records]
    assert lines[0].startswith("INFO:") and f'"POST {grab} HTTP/1.1" 200' in lines[0]
    assert f'"POST {grab} HTTP/1.1" 401' in lines[1]
