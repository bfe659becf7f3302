"""End to end: `hongbao serve` as a subprocess on the embedded default, driven over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hongbao.metrics import PUBLISH_SECONDS
from tests.api.serving import (
    CLIENT_LIMITS,
    Serve,
    audit,
    clean_env,
    command,
    connections_by_pid,
    run_cli,
    separate_worker,
    servers_for,
    worker_pids,
)
from tests.servers import alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GRABBERS = 1_000
SHARES = 100


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def check_problem(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == code and r.json()["status"] == status


async def poll(
    client: httpx.AsyncClient, path: str, headers: dict[str, str], key: str, want: Any
) -> Any:
    deadline = time.monotonic() + 20
    while True:
        got = (await client.get(path, headers=headers)).json()[key]
        if got == want or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.1)


async def drive(server: Serve) -> dict[str, Any]:
    """Everything a user does over HTTP; returns what must survive a restart."""
    [admin] = server.tokens("admin", admin=True)
    users = [f"user{i:04d}" for i in range(GRABBERS)]
    minted = server.tokens("sender", "other", *users)
    sender, other, grabbers = minted[0], minted[1], minted[2:]
    assert len(grabbers) == GRABBERS
    async with httpx.AsyncClient(base_url=server.url, limits=CLIENT_LIMITS, timeout=30) as client:
        r = await client.post(
            "/v1/wallets/sender/deposits", json={"amount": 1_000_000}, headers=auth(admin)
        )
        assert r.status_code == 201 and r.json() == {"user_id": "sender", "balance": 1_000_000}

        # one packet, 100 shares, 1,000 concurrent grabbers
        r = await client.post(
            "/v1/packets",
            json={"total_amount": 50_000, "count": SHARES, "mode": "lucky", "greeting": "新年快乐"},
            headers={**auth(sender), "Idempotency-Key": "e2e-big"},
        )
        assert r.status_code == 201, r.text
        big = r.json()
        grabs = await asyncio.gather(
            *(client.post(f"/v1/packets/{big['id']}/grab", headers=auth(t)) for t in grabbers)
        )
        winners = {r.json()["user_id"]: r.json() for r in grabs if r.status_code == 200}
        assert len(winners) == SHARES
        assert all(w["first"] is True for w in winners.values())
        assert sum(w["amount"] for w in winners.values()) == 50_000
        assert sorted(w["seq"] for w in winners.values()) == list(range(1, SHARES + 1))
        losers = [r for r in grabs if r.status_code != 200]
        assert len(losers) == GRABBERS - SHARES
        for r in losers:
            check_problem(r, 410, "packet_exhausted")

        # repeat grabs: the same share, first=false; losers stay exhausted
        token_of = dict(zip(users, grabbers, strict=True))
        repeats = await asyncio.gather(
            *(
                client.post(f"/v1/packets/{big['id']}/grab", headers=auth(token_of[u]))
                for u in winners
            )
        )
        for r in repeats:
            assert r.status_code == 200
            assert r.json() == {**winners[r.json()["user_id"]], "first": False}
        loser = next(u for u in users if u not in winners)
        r = await client.post(f"/v1/packets/{big['id']}/grab", headers=auth(token_of[loser]))
        check_problem(r, 410, "packet_exhausted")

        r = await client.get(f"/v1/packets/{big['id']}/claims", headers=auth(other))
        claims = r.json()
        assert len(claims["claims"]) == SHARES
        assert {c["user_id"]: (c["amount"], c["seq"]) for c in claims["claims"]} == {
            u: (w["amount"], w["seq"]) for u, w in winners.items()
        }
        top = max(w["amount"] for w in winners.values())
        assert winners[claims["best_luck"]]["amount"] == top
        r = await client.get(f"/v1/packets/{big['id']}", headers=auth(other))
        assert r.json()["status"] == "exhausted" and r.json()["remaining_amount"] == 0

        # winners' wallets are credited by the persister
        for u, w in list(winners.items())[:20]:
            got = await poll(client, f"/v1/wallets/{u}", auth(admin), "balance", w["amount"])
            assert got == w["amount"], u

        # an expiring packet: two grabs, then expiry, 410 and a refund to the sender
        r = await client.post(
            "/v1/packets",
            json={"total_amount": 500, "count": 5, "mode": "equal", "expires_in": 1},
            headers=auth(sender),
        )
        short = r.json()
        late = [u for u in users if u not in winners][:3]
        for u in late[:2]:
            r = await client.post(f"/v1/packets/{short['id']}/grab", headers=auth(token_of[u]))
            assert r.status_code == 200 and r.json()["amount"] == 100
        await asyncio.sleep(1.2)
        r = await client.post(f"/v1/packets/{short['id']}/grab", headers=auth(token_of[late[2]]))
        check_problem(r, 410, "packet_expired")
        expected = 1_000_000 - 50_000 - 500 + 300
        got = await poll(client, "/v1/wallets/sender", auth(sender), "balance", expected)
        assert got == expected
        r = await client.get(f"/v1/packets/{short['id']}", headers=auth(sender))
        assert r.json()["status"] == "expired"

        await error_rows(client, admin, sender, other, big["id"])

        # let the persister catch up, then take the snapshot that must survive a restart
        owed = {u: w["amount"] for u, w in winners.items()} | {late[0]: 100, late[1]: 100}
        for u, amount in owed.items():
            got = await poll(client, f"/v1/wallets/{u}", auth(admin), "balance", amount)
            assert got == amount, u
        return await snapshot(client, admin, [big["id"], short["id"]], ["sender", *users])


async def error_rows(
    client: httpx.AsyncClient, admin: str, sender: str, other: str, packet_id: str
) -> None:
    """Every error row of the contract, over real HTTP."""
    r = await client.get("/v1/wallets/sender")
    check_problem(r, 401, "unauthorized")
    r = await client.get("/v1/wallets/sender", headers=auth(sender[:-2] + "xx"))
    check_problem(r, 401, "unauthorized")
    check_problem(await client.get("/v1/wallets/sender", headers=auth(other)), 403, "forbidden")
    r = await client.post("/v1/wallets/other/deposits", json={"amount": 5}, headers=auth(other))
    check_problem(r, 403, "forbidden")
    r = await client.post("/v1/wallets/other/deposits", json={"amount": 5.0}, headers=auth(admin))
    check_problem(r, 422, "invalid_request")
    assert r.json()["field"] == "amount"
    body = {"total_amount": 1000, "count": 0, "mode": "lucky"}
    r = await client.post("/v1/packets", json=body, headers=auth(sender))
    check_problem(r, 422, "invalid_request")
    assert r.json()["field"] == "count"
    body = {"total_amount": 1000, "count": 2, "mode": "lucky"}
    r = await client.post("/v1/packets", json=body, headers=auth(other))
    check_problem(r, 409, "insufficient_balance")
    r = await client.post(
        "/v1/packets",
        json={**body, "count": 3},
        headers={**auth(sender), "Idempotency-Key": "e2e-big"},
    )
    check_problem(r, 409, "idempotency_conflict")
    r = await client.get("/v1/packets/01aaaaaaaaaaaaaaaaaaaaaaaa", headers=auth(other))
    check_problem(r, 404, "packet_not_found")
    r = await client.post("/v1/packets/01aaaaaaaaaaaaaaaaaaaaaaaa/grab", headers=auth(other))
    check_problem(r, 404, "packet_not_found")
    r = await client.get("/v1/packets/01aaaaaaaaaaaaaaaaaaaaaaaa/claims", headers=auth(other))
    check_problem(r, 404, "packet_not_found")
    r = await client.post(
        "/v1/packets",
        content=json.dumps({**body, "greeting": "x" * 20_000}),
        headers={**auth(sender), "content-type": "application/json"},
    )
    check_problem(r, 413, "payload_too_large")
    r = await client.post("/v1/packets", content="count=2", headers=auth(sender))
    check_problem(r, 415, "unsupported_media_type")
    r = await client.get(f"/v1/packets/{packet_id}", headers=auth(other))
    assert r.status_code == 200
    assert (await client.get("/readyz")).status_code == 200
    assert "hongbao_grabs_total" in (await client.get("/metrics")).text


async def snapshot(
    client: httpx.AsyncClient, admin: str, packets: list[str], users: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pid in packets:
        out[f"packet:{pid}"] = (await client.get(f"/v1/packets/{pid}", headers=auth(admin))).json()
        r = await client.get(f"/v1/packets/{pid}/claims", headers=auth(admin))
        out[f"claims:{pid}"] = r.json()
    balances = await asyncio.gather(
        *(client.get(f"/v1/wallets/{u}", headers=auth(admin)) for u in users)
    )
    for u, r in zip(users, balances, strict=True):
        out[f"wallet:{u}"] = r.json()["balance"]
    return out


def no_server_left(data_dir: Path, within: float = 15) -> None:
    """The embedded server of `data_dir` is gone (SIGTERM from Linux flushes its AOF)."""
    deadline = time.monotonic() + within
    while left := servers_for(data_dir):
        assert time.monotonic() < deadline, f"left running: {left}"
        time.sleep(0.1)


def stop_cleanly(server: Serve) -> None:
    assert server.stop(signal.SIGTERM) == 0, server.log()
    assert "Traceback" not in server.log(), server.log()
    assert servers_for(server.data_dir) == []


def test_serve_end_to_end_and_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = Serve(data_dir)
    with server:
        before = asyncio.run(drive(server))
        stop_cleanly(server)
    secret = data_dir / "secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert (data_dir / "ledger.sqlite3").exists()
    assert audit(data_dir) == []

    again = Serve(data_dir)  # a new port: nothing depends on the old one
    with again:
        [admin] = again.tokens("admin", admin=True)

        async def after() -> dict[str, Any]:
            async with httpx.AsyncClient(
                base_url=again.url, limits=CLIENT_LIMITS, timeout=30
            ) as client:
                packets = [k.split(":", 1)[1] for k in before if k.startswith("packet:")]
                users = [k.split(":", 1)[1] for k in before if k.startswith("wallet:")]
                return await snapshot(client, admin, packets, users)

        assert asyncio.run(after()) == before
        big = next(v for k, v in before.items() if k.startswith("claims:") and v["claims"])
        claim = big["claims"][0]
        [token] = again.tokens(claim["user_id"])
        r = httpx.post(f"{again.url}/v1/packets/{big['packet_id']}/grab", headers=auth(token))
        assert r.status_code == 200
        assert r.json() == {
            "packet_id": big["packet_id"],
            "user_id": claim["user_id"],
            "amount": claim["amount"],
            "seq": claim["seq"],
            "first": False,
        }
        stop_cleanly(again)
    assert audit(data_dir) == []


def _send_grab_expire(server: Serve) -> None:
    """A send, a grab and an expiry refund: proves the persister and sweeper run somewhere."""
    [admin] = server.tokens("admin", admin=True)
    sender, grabber = server.tokens("sender", "grabber")
    with httpx.Client(base_url=server.url, limits=CLIENT_LIMITS, timeout=30) as client:
        r = client.post("/v1/wallets/sender/deposits", json={"amount": 1000}, headers=auth(admin))
        assert r.status_code == 201, r.text
        r = client.post(
            "/v1/packets",
            json={"total_amount": 300, "count": 3, "mode": "equal", "expires_in": 1},
            headers=auth(sender),
        )
        pid = r.json()["id"]
        r = client.post(f"/v1/packets/{pid}/grab", headers=auth(grabber))
        assert r.status_code == 200 and r.json()["amount"] == 100
        deadline = time.monotonic() + 20
        want = {"sender": 900, "grabber": 100}
        while True:
            got = {
                u: client.get(f"/v1/wallets/{u}", headers=auth(admin)).json()["balance"]
                for u in want
            }
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert got == want
        check_problem(
            client.post(f"/v1/packets/{pid}/grab", headers=auth(admin)), 410, "packet_expired"
        )


def niceness(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def niceness_below(server: Serve, pids: list[int], timeout: float = 30) -> list[int]:
    """How many nice steps each worker runs below serve, once it has set its own (a
    worker lowers its priority as it starts, after its interpreter loaded)."""
    assert server.proc is not None
    deadline = time.monotonic() + timeout
    while True:
        below = [niceness(pid) - niceness(server.proc.pid) for pid in pids]
        if all(below) or time.monotonic() > deadline:
            return below
        time.sleep(0.1)


def _grab_counts(text: str) -> dict[str, float]:
    prefix = 'hongbao_grabs_total{outcome="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def test_serve_with_several_api_processes(tmp_path: Path) -> None:
    server = Serve(tmp_path / "data", None, "--workers", "2")
    with server:
        _send_grab_expire(server)  # one granted grab, one refused as expired
        # each scrape on a new connection, answered by either worker: once the workers
        # have published (every PUBLISH_SECONDS), every scrape counts both grabs
        deadline = time.monotonic() + 10 * PUBLISH_SECONDS
        while True:
            time.sleep(PUBLISH_SECONDS)
            scrapes = [httpx.get(f"{server.url}/metrics", timeout=10).text for _ in range(12)]
            seen = [_grab_counts(text) for text in scrapes]
            if all((c["granted"], c["expired"]) == (1, 1) for c in seen):
                break
            assert time.monotonic() < deadline, scrapes
        assert server.proc is not None
        shared = tmp_path / "data" / "metrics" / str(server.proc.pid)
        assert len(list(shared.glob("*.json"))) == 2  # the workers' tallies
        stop_cleanly(server)
    assert not shared.exists()
    assert audit(tmp_path / "data") == []


def test_api_processes_share_the_connections_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    server = Serve(tmp_path / "data", None, "--workers", "2")
    with server:
        workers = worker_pids(server)
        assert len(workers) == 2, server.log()
        # the persister runs in serve's own process: the API workers yield the CPU to it
        assert niceness_below(server, workers) == [8, 8]
        # each worker accepts on a socket of its own (SO_REUSEPORT): 40 connections opened
        # together are spread across both (fewer than 8 on one: odds ~1e-5 if random)
        clients = [
            httpx.Client(base_url=server.url, limits=CLIENT_LIMITS, timeout=10) for _ in range(40)
        ]
        try:
            for client in clients:
                assert client.get("/healthz").status_code == 200
            held = connections_by_pid(server.port, workers)
            assert sum(held.values()) == 40 and min(held.values()) >= 8, held
        finally:
            for client in clients:
                client.close()
        # a worker killed outright is replaced; the server answers throughout
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (now := worker_pids(server)) == workers or len(now) != 2:
            assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.2)
        assert workers[0] not in now
        assert niceness_below(server, now) == [8, 8]
        assert f"worker {workers[0]} exited (-9)" in " ".join(server.log().split())  # wrapped
        stop_cleanly(server)


def test_api_workers_stop_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    """A SIGKILLed `serve --workers 2` cannot stop its workers itself: Linux does
    (PR_SET_PDEATHSIG), so none is left serving on the port with nobody to restart it."""
    server = Serve(tmp_path / "data", None, "--workers", "2")
    workers: list[int] = []
    try:
        with server:
            workers = worker_pids(server)
            assert len(workers) == 2, server.log()
            assert server.stop(signal.SIGKILL) == -signal.SIGKILL
            deadline = time.monotonic() + 30
            while left := [pid for pid in workers if alive(pid)]:
                assert time.monotonic() < deadline, f"workers {left} outlived their supervisor"
                time.sleep(0.1)
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{server.url}/healthz", timeout=2)
            # its workers' folder is left behind; the next start removes it (test_metrics)
            assert server.proc is not None
            assert (tmp_path / "data" / "metrics" / str(server.proc.pid)).is_dir()
        no_server_left(tmp_path / "data")  # nor the embedded server
    finally:
        orphans = [int(line.split()[0]) for line in servers_for(tmp_path / "data")]
        for pid in orphans + [pid for pid in workers if alive(pid)]:
            os.kill(pid, signal.SIGTERM)


#: the CLI as on a platform without SO_REUSEPORT (not Linux)
WITHOUT_REUSE_PORT = [
    sys.executable,
    "-c",
    "import hongbao.serving.workers as w; w.reuse_port_available = lambda: False; "
    "from hongbao.cli import main; main()",
]


def test_serve_workers_without_reuse_port(tmp_path: Path) -> None:
    """Off Linux `serve --workers N` hands the workers to uvicorn's own supervisor."""
    data_dir = tmp_path / "data"
    server = Serve(data_dir, None, "--workers", "2", launcher=WITHOUT_REUSE_PORT)
    with server:
        workers = worker_pids(server)
        assert len(workers) == 2, server.log()
        assert "Started parent process" in server.log()  # uvicorn's supervisor, not ours
        _send_grab_expire(server)
        stop_cleanly(server)
    assert not [pid for pid in workers if alive(pid)]
    assert audit(data_dir) == []


def test_serve_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli(
            "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--workers", "2"
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_external_redis_with_a_separate_worker(tmp_path: Path, redis_url: str) -> None:
    """`serve --no-persister` on a configured Redis; `hongbao worker` applies the events."""
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    data_dir = tmp_path / "data"
    env = clean_env(HONGBAO_SECRET="e2e-tests-shared-secret-0123456789")
    server = Serve(
        data_dir, None, "--redis-url", redis_url, "--no-persister", "--workers", "2", env=env
    )
    with server:
        # an API node: no persister here to yield the CPU to. A worker listens once it
        # has set its priority.
        assert server.proc is not None
        deadline = time.monotonic() + 30
        while not (
            len(workers := worker_pids(server)) == 2
            and all(connections_by_pid(server.port, workers, "0A").values())
        ):
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
        assert {niceness(pid) for pid in workers} == {niceness(server.proc.pid)}
        with separate_worker(redis_url, data_dir):
            _send_grab_expire(server)
        stop_cleanly(server)
    assert audit(data_dir) == []
    redis.Redis.from_url(redis_url).flushdb()


def test_ctrl_c_and_restart_after_a_crash(tmp_path: Path) -> None:
    """SIGINT stops cleanly; after a SIGKILLed run the stale server is replaced at next start."""
    data_dir = tmp_path / "data"
    server = Serve(data_dir)
    with server:
        _send_grab_expire(server)
        assert server.stop(signal.SIGINT) == 0, server.log()
        assert servers_for(data_dir) == []

    crashed = Serve(data_dir)
    with crashed:
        assert crashed.stop(signal.SIGKILL) == -signal.SIGKILL
        no_server_left(data_dir)  # the embedded server dies with its serve

    again = Serve(data_dir)
    with again:
        [admin] = again.tokens("admin", admin=True)
        r = httpx.get(f"{again.url}/v1/wallets/sender", headers=auth(admin))
        assert r.json()["balance"] == 900
        assert len(servers_for(data_dir)) == 1
        stop_cleanly(again)
    assert audit(data_dir) == []


def test_a_worker_joins_the_embedded_server_of_a_running_serve(tmp_path: Path) -> None:
    """`hongbao worker --data-dir` finds the socket of the serve running on that folder."""
    import redis

    data_dir = tmp_path / "data"
    server = Serve(data_dir)
    with server:
        with separate_worker(None, data_dir, "--consumer-name", "extra"):
            _send_grab_expire(server)
            url = f"unix://{data_dir}/redis/valkey.sock?db=0"
            with redis.Redis.from_url(url, decode_responses=True) as r:
                deadline = time.monotonic() + 20
                while True:
                    names = {c["name"] for c in r.xinfo_consumers("hb:{b0}:ev", "persister")}
                    if "extra" in names or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
            assert {"serve", "extra"} <= names
        stop_cleanly(server)
    assert audit(data_dir) == []


async def grab_all(server: Serve, packet_id: str, tokens: list[str]) -> dict[str, int]:
    """Every token grabs once, all at once; the amount each acknowledged grab got."""
    async with httpx.AsyncClient(base_url=server.url, limits=CLIENT_LIMITS, timeout=30) as client:
        answers = await asyncio.gather(
            *(client.post(f"/v1/packets/{packet_id}/grab", headers=auth(t)) for t in tokens)
        )
    return {r.json()["user_id"]: r.json()["amount"] for r in answers if r.status_code == 200}


async def ledger_claims(data_dir: Path, packet_id: str) -> dict[str, int]:
    from hongbao.ledger import SqlLedger
    from hongbao.serving.embedded import ledger_url

    ledger = SqlLedger.from_url(ledger_url(data_dir))
    try:
        return {c.user_id: c.amount for c in await ledger.claims_of(packet_id)}
    finally:
        await ledger.aclose()


def test_serve_killed_leaves_nothing_running_and_its_next_run_settles_at_once(
    tmp_path: Path,
) -> None:
    """After `kill -9` of serve, the embedded server is gone too; the next run's
    persister takes over what the killed one had read and not applied, at once
    (not after persister_claim_idle_ms)."""
    data_dir = tmp_path / "data"
    crashed = Serve(data_dir)
    with crashed:
        [admin] = crashed.tokens("admin", admin=True)
        [sender] = crashed.tokens("sender")
        tokens = crashed.tokens(*(f"g{i}" for i in range(200)))
        with httpx.Client(base_url=crashed.url, limits=CLIENT_LIMITS, timeout=30) as client:
            r = client.post(
                "/v1/wallets/sender/deposits", json={"amount": 2000}, headers=auth(admin)
            )
            assert r.status_code == 201, r.text
            r = client.post(
                "/v1/packets",
                json={"total_amount": 2000, "count": 200, "mode": "lucky"},
                headers=auth(sender),
            )
            packet_id = r.json()["id"]
        acked = asyncio.run(grab_all(crashed, packet_id, tokens))
        assert crashed.stop(signal.SIGKILL) == -signal.SIGKILL
        no_server_left(data_dir)
    assert len(acked) == 200

    again = Serve(data_dir)
    with again:
        started = time.monotonic()
        while (found := asyncio.run(ledger_claims(data_dir, packet_id))) != acked:
            assert time.monotonic() - started < 3, f"{len(acked) - len(found)} grabs missing"
            time.sleep(0.05)
        stop_cleanly(again)
    assert audit(data_dir) == []


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_to_serve_and_its_valkey_at_once_stops_cleanly(
    tmp_path: Path, workers: str
) -> None:
    """systemd's default KillMode=control-group signals every process of the service:
    the embedded server exits with serve, and is not restarted meanwhile."""
    data_dir = tmp_path / "data"
    server = Serve(data_dir, None, "--workers", workers)
    with server:
        _send_grab_expire(server)
        [valkey] = [int(line.split()[0]) for line in servers_for(data_dir)]
        assert server.proc is not None
        os.kill(valkey, signal.SIGTERM)
        os.kill(server.proc.pid, signal.SIGTERM)
        assert server.proc.wait(60) == 0, server.log()
        words = " ".join(server.log().split())  # Rich wraps the lines
        assert "restarting it" not in words and "is back" not in words, words
        assert "Traceback" not in words, words
        no_server_left(data_dir)
    assert audit(data_dir) == []


def test_a_fresh_serve_after_a_crash_puts_back_what_its_valkey_lost(tmp_path: Path) -> None:
    """After a host crash the AOF may lack its last second while the ledger already holds
    those claims: the next serve restores them from the ledger before it serves, so no
    share is granted twice."""
    import redis

    from hongbao.keys import PacketKeys

    data_dir = tmp_path / "data"
    crashed = Serve(data_dir, launcher=["setsid", *command()])
    with crashed:
        [admin] = crashed.tokens("admin", admin=True)
        sender, alice, bob = crashed.tokens("sender", "alice", "bob")
        with httpx.Client(base_url=crashed.url, timeout=30) as client:
            r = client.post(
                "/v1/wallets/sender/deposits", json={"amount": 200}, headers=auth(admin)
            )
            assert r.status_code == 201, r.text
            r = client.post(
                "/v1/packets",
                json={"total_amount": 200, "count": 2, "mode": "equal"},
                headers=auth(sender),
            )
            packet_id = r.json()["id"]
            r = client.post(f"/v1/packets/{packet_id}/grab", headers=auth(alice))
            assert r.status_code == 200 and r.json()["seq"] == 1, r.text
            claim = r.json()
        deadline = time.monotonic() + 20
        while asyncio.run(ledger_claims(data_dir, packet_id)) != {"alice": 100}:
            assert time.monotonic() < deadline, crashed.log()
            time.sleep(0.1)
        # the AOF's last second lost: Redis forgets alice's claim, the share is back
        keys = PacketKeys.of(packet_id, 16)
        url = f"unix://{data_dir}/redis/valkey.sock?db=0"
        with redis.Redis.from_url(url) as r:
            assert r.hdel(keys.claims, "alice") == 1
            r.lpush(keys.shares, str(0 * 2**32 + 100))
            r.hincrby(keys.meta, "left", 100)
            r.execute_command("WAITAOF", 1, 0, 2000)
        [valkey] = [int(line.split()[0]) for line in servers_for(data_dir)]
        assert crashed.proc is not None
        os.killpg(crashed.proc.pid, signal.SIGKILL)  # the host goes down: serve and
        os.kill(valkey, signal.SIGKILL)  # its server at once, nothing shut down cleanly
        crashed.proc.wait(30)
        no_server_left(data_dir)

    again = Serve(data_dir)
    with again:
        with httpx.Client(base_url=again.url, timeout=30) as client:
            r = client.post(f"/v1/packets/{packet_id}/grab", headers=auth(bob))
            assert r.status_code == 200 and r.json()["seq"] == 2, r.text
            r = client.post(f"/v1/packets/{packet_id}/grab", headers=auth(alice))
            assert r.json() == {**claim, "first": False}, r.text
        stop_cleanly(again)
    assert audit(data_dir) == []
