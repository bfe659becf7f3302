"""The findings of a security review, each through the HTTP API: demo sign-in apart from
real users, default rate limits, bounded reads, headers, text rules and clear errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from starlette.applications import Starlette

from hongbao.app import create_app
from hongbao.cli.options import safe_url
from hongbao.errors import PacketNotFound
from hongbao.ledger import SqlLedger
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage import RedisStore
from hongbao.storage.redis import brief
from hongbao.web.routes import MAX_STREAMS_PER_USER
from tests.api.conftest import ADMIN, BASE, SECRET, bearer, eventually
from tests.api.serving import Serve, free_port, run_cli
from tests.api.test_api import balance, deposit, problem, send

pytestmark = [pytest.mark.redis]

SECURITY_HEADERS = {"x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}


@pytest.fixture
async def demo_client(
    settings: Settings, store: RedisStore, ledger: SqlLedger
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app in demo mode (`hongbao serve --demo`)."""
    app = create_app(settings, SECRET, run_workers=False, demo_mode=True)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
            yield c


@pytest.fixture
async def raw_client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app that also reads what the OpenAPI document does not describe."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        yield c


async def test_demo_sign_in_is_off_unless_asked_for(raw_client: httpx.AsyncClient) -> None:
    r = await raw_client.post("/demo/token", json={"name": "alice"})
    problem(r, 404, "not_found")
    page = await raw_client.get("/")
    assert '<meta name="hongbao-demo" content="0">' in page.text


async def test_demo_users_live_apart_from_real_users(demo_client: httpx.AsyncClient) -> None:
    await deposit(demo_client, "alice", 5_000)
    r = await demo_client.post("/demo/token", json={"name": "alice"})
    assert r.status_code == 201, r.text
    signed_in = r.json()
    assert signed_in["user_id"] == "demo-alice" and signed_in["balance"] == 10_000
    demo = {"Authorization": f"Bearer {signed_in['token']}"}
    problem(await demo_client.get("/v1/wallets/alice", headers=demo), 403, "forbidden")
    mine = await demo_client.get("/v1/wallets/demo-alice", headers=demo)
    assert mine.json() == {"user_id": "demo-alice", "balance": 10_000}
    assert await balance(demo_client, "alice") == 5_000
    long = await demo_client.post("/demo/token", json={"name": "x" * 33})
    problem(long, 422, "invalid_request", "name")


async def test_demo_sign_in_is_rate_limited_per_address(demo_client: httpx.AsyncClient) -> None:
    answers = [
        (await demo_client.post("/demo/token", json={"name": f"n{i}"})).status_code
        for i in range(32)
    ]
    assert answers.count(201) == 30 and answers[-1] == 429


async def test_rate_limits_are_on_by_default(
    settings: Settings, store: RedisStore, ledger: SqlLedger
) -> None:
    defaults = Settings()
    assert defaults.rate_limit_user > 0 and defaults.rate_limit_ip > 0
    limited = replace(
        settings, rate_limit_user=defaults.rate_limit_user, rate_limit_ip=defaults.rate_limit_ip
    )
    app = create_app(limited, SECRET, run_workers=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
            await deposit(c, "alice", 100_000)
            packet = await send(c, "alice", total_amount=10_000, count=100)
            bob = bearer("bob")
            codes = [
                (await c.post(f"/v1/packets/{packet['id']}/grab", headers=bob)).status_code
                for _ in range(limited.rate_limit_burst + 30)
            ]
    assert codes[0] == 200 and 429 in codes


async def test_claims_come_a_page_at_a_time(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 10_000)
    packet = await send(client, "alice", total_amount=500, count=5)
    url = f"/v1/packets/{packet['id']}/claims"
    for i in range(5):
        r = await client.post(f"/v1/packets/{packet['id']}/grab", headers=bearer(f"u{i}"))
        assert r.status_code == 200
    whole = (await client.get(url, headers=bearer("alice"))).json()
    assert len(whole["claims"]) == 5 and whole["next_cursor"] is None
    pages: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await client.get(url, params=params, headers=bearer("alice"))).json()
        pages.append(page)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [len(p["claims"]) for p in pages] == [2, 2, 1]
    assert [c for p in pages for c in p["claims"]] == whole["claims"]
    for page in pages:  # best luck and the totals are the whole packet's on every page
        assert page["best_luck"] == whole["best_luck"] is not None
        assert (page["claimed_count"], page["claimed_amount"]) == (5, 500)
    for bad in ({"limit": "0"}, {"limit": "1001"}, {"limit": "x"}):
        problem(
            await client.get(url, params=bad, headers=bearer("alice")),
            422,
            "invalid_request",
            "limit",
        )
    r = await client.get(url, params={"cursor": "not-a-cursor"}, headers=bearer("alice"))
    problem(r, 422, "invalid_request", "cursor")


@pytest.mark.parametrize("greeting", ["\u202egnp.exe", "a\u2066b", "c1\x85", "del\x7f"])
async def test_greetings_refuse_control_and_direction_characters(
    client: httpx.AsyncClient, greeting: str
) -> None:
    await deposit(client, "alice", 1_000)
    r = await client.post(
        "/v1/packets",
        json={"total_amount": 100, "count": 1, "mode": "equal", "greeting": greeting},
        headers=bearer("alice"),
    )
    body = problem(r, 422, "invalid_request", "greeting")
    assert "control or text-direction" in body["detail"]
    assert await balance(client, "alice") == 1_000


async def test_every_response_carries_the_security_headers(
    raw_client: httpx.AsyncClient,
) -> None:
    client = raw_client
    await deposit(client, "alice", 1_000)
    packet = await send(client, "alice", total_amount=100, count=1)
    grab = f"/v1/packets/{packet['id']}/grab"
    responses = [
        await client.post(grab, headers=bearer("bob")),  # the fast path's 200
        await client.post(grab, headers=bearer("carol")),  # the fast path's refusal
        await client.get("/"),
        await client.get("/openapi.json"),
        await client.get("/healthz"),
        await client.get("/nowhere"),
        await client.get("/v1/wallets/alice"),
    ]
    for r in responses:
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, (r.request.url, r.status_code, r.headers)


async def test_an_expired_packet_says_what_went_back(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1_000)
    packet = await send(client, "alice", total_amount=600, count=3, expires_in=1)
    r = await client.post(f"/v1/packets/{packet['id']}/grab", headers=bearer("bob"))
    mine = r.json()["amount"]
    assert packet["refunded_amount"] == 0
    await asyncio.sleep(1.1)

    async def refunded() -> int:
        got = await client.get(f"/v1/packets/{packet['id']}", headers=bearer("alice"))
        return int(got.json()["refunded_amount"])

    assert await eventually(refunded, 600 - mine) == 600 - mine
    assert await eventually(lambda: balance(client, "alice"), 1_000 - mine) == 1_000 - mine


async def test_messages_are_short_and_name_the_field(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1_000)
    huge = "0" * 5_000
    r = await client.get(f"/v1/packets/{huge}", headers=bearer("alice"))
    assert len(problem(r, 404, "packet_not_found")["detail"]) < 120
    r = await client.post(f"/v1/packets/{huge}/grab", headers=bearer("bob"))
    assert len(problem(r, 404, "packet_not_found")["detail"]) < 120
    r = await client.get(f"/{huge}")
    assert len(problem(r, 404, "not_found")["detail"]) < 120
    r = await client.post(
        "/v1/packets", json={"total_amount": 100, "count": 0, "mode": "lucky"}, headers=bearer("a")
    )
    assert problem(r, 422, "invalid_request", "count")["detail"] == "count must be at least 1"
    r = await client.post(
        "/v1/packets", json={"total_amount": 100, "count": 1, "mode": "odd"}, headers=bearer("a")
    )
    assert (
        problem(r, 422, "invalid_request", "mode")["detail"]
        == "mode must be one of 'lucky' or 'equal'"
    )
    r = await client.post("/v1/wallets/alice/deposits", json={"amount": -5}, headers=ADMIN)
    assert problem(r, 422, "invalid_request", "amount")["detail"] == "amount must be at least 1"


def test_urls_and_errors_are_shown_briefly() -> None:
    assert safe_url("postgresql://postgres@db/x") == "postgresql://postgres@db/x"
    assert safe_url("postgresql://u:secret@db/x") == "postgresql://u:***@db/x"
    noisy = ValueError("No master found for 'mymaster' : " + "ConnectionPool<...>" * 100)
    assert len(brief(noisy)) <= 201 and brief(noisy).startswith("No master found")


async def test_an_unknown_packet_costs_one_read_and_no_write_lock(service: Hongbao) -> None:
    """A well-formed id of no packet: one ledger query, and SQLite takes no write lock."""
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    engine = service.ledger.engine.sync_engine
    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        for _ in range(2):
            with pytest.raises(PacketNotFound):
                await service.grab("01aaaaaaaaaaaaaaaaaaaaaaaa", "bob")
            queries = [s for s in statements if not s.upper().startswith(("BEGIN", "ROLLBACK"))]
            assert len(queries) == 1 and "hb_packets" in queries[0], statements
            assert not [s for s in statements if "IMMEDIATE" in s.upper()], statements
            statements.clear()
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)


async def test_sqlite_reads_do_not_take_the_write_lock(tmp_path: Any) -> None:
    """While a writer holds SQLite's write lock, reads still answer at once."""
    ledger = SqlLedger.from_url(f"sqlite+aiosqlite:///{tmp_path / 'l.sqlite3'}")
    await ledger.migrate()
    await ledger.deposit("alice", 100, "k1")
    try:
        async with ledger.engine.connect() as writer:
            update = "UPDATE hb_wallets SET balance = balance WHERE user_id = 'alice'"
            await writer.exec_driver_sql(update)  # holds the write lock until rolled back
            assert await asyncio.wait_for(ledger.balance("alice"), 2) == 100
            unknown = ledger.get_packet("01aaaaaaaaaaaaaaaaaaaaaaaa")
            assert await asyncio.wait_for(unknown, 2) is None
            await writer.rollback()
    finally:
        await ledger.aclose()


# -- through `hongbao serve` ---------------------------------------------------------------------


def test_demo_is_refused_on_a_public_address_without_demo_public(tmp_path: Path) -> None:
    done = run_cli("serve", "--demo", "--host", "0.0.0.0", "--data-dir", str(tmp_path / "d"))
    assert done.returncode == 2, done.stderr
    assert "--demo-public" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "d").exists()  # nothing started


def test_demo_mode_says_so_when_it_starts(tmp_path: Path) -> None:
    with Serve(tmp_path / "data", None, "--demo") as server:
        r = httpx.post(f"{server.url}/demo/token", json={"name": "zoe"})
        assert r.status_code == 201 and r.json()["user_id"] == "demo-zoe"
        assert "DEMO MODE" in server.log()


def test_forwarded_for_counts_only_from_trusted_proxies(tmp_path: Path) -> None:
    """A peer that is not a trusted proxy is limited by its own address, whatever its
    X-Forwarded-For says; a trusted proxy's X-Forwarded-For names the client."""
    limits = {"HONGBAO_RATE_LIMIT_IP": "1", "HONGBAO_RATE_LIMIT_BURST": "2"}

    def codes(server: Serve) -> list[int]:
        (token,) = server.tokens("bob")
        return [
            httpx.post(
                f"{server.url}/v1/packets/01aaaaaaaaaaaaaaaaaaaaaaaa/grab",
                headers={"Authorization": f"Bearer {token}", "X-Forwarded-For": f"10.0.0.{i}"},
            ).status_code
            for i in range(4)
        ]

    with Serve(tmp_path / "a", None, env=limits) as server:
        assert codes(server)[-1] == 429
    with Serve(tmp_path / "b", None, "--trusted-proxies", "127.0.0.1", env=limits) as server:
        assert 429 not in codes(server)


def test_metrics_on_an_address_of_their_own(tmp_path: Path) -> None:
    port = free_port()
    with Serve(
        tmp_path / "data", None, "--metrics-host", "127.0.0.1", "--metrics-port", str(port)
    ) as server:
        assert httpx.get(f"{server.url}/metrics").status_code == 404
        r = httpx.get(f"http://127.0.0.1:{port}/metrics")
        assert r.status_code == 200 and "hongbao_grabs_total" in r.text
        assert "/metrics" not in httpx.get(f"{server.url}/openapi.json").json()["paths"]


def bearer_of(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_live_streams_are_capped_per_user(tmp_path: Path) -> None:
    with Serve(tmp_path / "data", None) as server:
        admin, kate, leo = server.tokens("admin", admin=True) + server.tokens("kate", "leo")
        httpx.post(
            f"{server.url}/v1/wallets/kate/deposits",
            json={"amount": 1_000},
            headers={"Authorization": f"Bearer {admin}"},
        ).raise_for_status()
        sent = httpx.post(
            f"{server.url}/v1/packets",
            json={"total_amount": 100, "count": 1, "mode": "equal"},
            headers={"Authorization": f"Bearer {kate}"},
        )
        url = f"{server.url}/v1/packets/{sent.json()['id']}/events"
        with contextlib.ExitStack() as streams:
            for _ in range(MAX_STREAMS_PER_USER):
                stream = streams.enter_context(
                    httpx.stream("GET", url, headers=bearer_of(kate), timeout=10)
                )
                assert stream.status_code == 200
            over = httpx.get(url, headers=bearer_of(kate), timeout=10)
            assert over.status_code == 429 and over.json()["code"] == "too_many_streams"
            with httpx.stream("GET", url, headers=bearer_of(leo), timeout=10) as other:
                assert other.status_code == 200  # another user still may
        with httpx.stream("GET", url, headers=bearer_of(kate), timeout=10) as again:
            assert again.status_code == 200  # closed streams give their room back
