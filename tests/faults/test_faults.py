"""Faults injected into real processes under a bounded grab load (marker `faults`).

Run: ``pytest -m faults -s`` (``-s`` shows the one-line result of each fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import packets
from tests.faults.conftest import (
    BUCKETS,
    Load,
    PgCluster,
    Stack,
    audit_clean,
    kill_worker_repeatedly,
    measure,
    setup_packets,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]


def users(n: int) -> list[str]:
    return [f"u{i}" for i in range(n)]


def dead_letters(stack: Stack) -> int:
    client = stack.redis.client()
    try:
        return sum(int(client.xlen(f"hb:{{b{b}}}:dlq")) for b in range(BUCKETS))
    finally:
        client.close()


def test_persister_killed_mid_batch(make_stack: Any) -> None:
    stack: Stack = make_stack()
    ids = setup_packets(stack.urls[0], 4, 250)
    load = Load(stack.urls, ids, users(300), rate=500).start()
    kill_worker_repeatedly(stack, 4, every=0.5)
    result = load.wait()
    stack.wait_drained()
    outcome = measure(stack, "1. persister kill -9 (x4) mid-batch", result)
    assert outcome.acknowledged > 0
    assert outcome.lost == 0 and outcome.money_difference == 0
    assert dead_letters(stack) == 0
    audit_clean(stack)


def test_api_killed_under_load(make_stack: Any) -> None:
    stack: Stack = make_stack(apis=2)
    ids = setup_packets(stack.urls[0], 4, 250)
    load = Load(stack.urls, ids, users(300), rate=600).start()
    time.sleep(1.0)
    stack.apis[0].kill9()  # its in-flight grabs die with it; the load goes on via the other
    result = load.wait()
    stack.wait_drained()
    outcome = measure(stack, "2. API process kill -9", result)
    assert outcome.acknowledged > 0
    assert outcome.lost == 0 and outcome.money_difference == 0
    audit_clean(stack)


def restart_recover_and_finish(
    stack: Stack, ids: list[str], first: Load, lose_aof_tail: Any = None
) -> tuple[Any, int, int]:
    """Redis was just killed: stop the first load, optionally cut the AOF tail, restart
    Redis, run `hongbao recover`, grab again, drain. Returns (result, answers changed
    after the restart, AOF bytes cut)."""
    cut = lose_aof_tail() if lose_aof_tail is not None else 0
    result = first.stop()
    stack.redis.restart(timeout=30)
    done = stack.cli("recover")
    assert done.returncode == 0, done.stdout + done.stderr
    second = Load(stack.urls, ids, users(300), concurrency=48).start()
    changed = result.merge(second.wait())
    stack.wait_drained()
    return result, changed, cut


@pytest.mark.parametrize("ack", ["redis", "aof", "ledger"])
def test_redis_killed_aof_everysec(make_stack: Any, ack: str) -> None:
    stack: Stack = make_stack(ack=ack)
    ids = setup_packets(stack.urls[0], 4, 250)
    first = Load(stack.urls, ids, users(300), concurrency=48, rate=800).start()
    time.sleep(1.5)
    stack.redis.kill9()
    result, changed, _ = restart_recover_and_finish(stack, ids, first)
    outcome = measure(stack, f"3. Redis kill -9, AOF everysec, --ack {ack}", result)
    print(f"   answers changed after the restart: {changed}")
    assert outcome.acknowledged > 0 and outcome.money_difference == 0
    if ack in ("aof", "ledger"):
        assert outcome.lost == 0 and changed == 0
    audit_clean(stack)


class AofSizes:
    """Samples the size of the AOF being appended to, to cut it back later."""

    def __init__(self, stack: Stack) -> None:
        assert stack.redis.dir is not None
        self.dir = Path(stack.redis.dir) / "appendonlydir"
        self.samples: list[tuple[float, Path, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _current(self) -> Path:
        return max(self.dir.glob("*.incr.aof"), key=lambda p: p.stat().st_mtime)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                path = self._current()
                self.samples.append((time.monotonic(), path, path.stat().st_size))
            time.sleep(0.02)

    def lose_last(self, seconds: float) -> int:
        """Truncate the AOF to its size `seconds` ago (what an fsync every second keeps
        after a power loss); returns the bytes cut."""
        self._stop.set()
        self._thread.join()
        cutoff = time.monotonic() - seconds
        _, path, size = [s for s in self.samples if s[0] <= cutoff][-1]
        cut = path.stat().st_size - size
        os.truncate(path, size)
        return cut


@pytest.mark.parametrize("ack", ["redis", "ledger"])
def test_redis_power_loss_simulated(make_stack: Any, ack: str) -> None:
    """kill -9 keeps what Redis wrote in the page cache; a power loss does not. Cut the
    AOF back by one second (the `everysec` window) before the restart. Not run for
    `aof`: which bytes were fsynced is not observable from outside, so the cut could
    remove data WAITAOF confirmed."""
    stack: Stack = make_stack(ack=ack)
    ids = setup_packets(stack.urls[0], 4, 250)
    sizes = AofSizes(stack)
    first = Load(stack.urls, ids, users(300), concurrency=48, rate=500).start()
    time.sleep(1.5)
    stack.redis.kill9()
    result, changed, cut = restart_recover_and_finish(
        stack, ids, first, lose_aof_tail=lambda: sizes.lose_last(1.0)
    )
    outcome = measure(stack, f"3b. Redis power loss (last 1 s of AOF cut), --ack {ack}", result)
    print(f"   AOF bytes cut: {cut}; answers changed after the restart: {changed}")
    assert outcome.money_difference == 0
    if ack == "ledger":
        assert outcome.lost == 0 and changed == 0
    audit_clean(stack)


def test_redis_wiped(make_stack: Any) -> None:
    stack: Stack = make_stack()
    ids = setup_packets(stack.urls[0], 4, 250)
    first = Load(stack.urls, ids, users(300), rate=600).start()
    time.sleep(1.0)
    result = first.stop()
    stack.wait_drained()
    stack.redis.execute("FLUSHALL")
    done = stack.cli("recover")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rebuilt 4 packet(s)" in done.stdout or "rebuilt" in done.stdout
    second = Load(stack.urls, ids, users(300)).start()
    changed = result.merge(second.wait())
    stack.wait_drained()
    outcome = measure(stack, "4. Redis FLUSHALL, then recover", result)
    assert changed == 0  # every earlier owner got the same share back: none issued twice
    assert outcome.lost == 0 and outcome.money_difference == 0
    assert outcome.acknowledged == 4 * 250  # every share went out exactly once
    audit_clean(stack)


def test_database_down_20s(make_stack: Any, pg: PgCluster) -> None:
    stack: Stack = make_stack()
    ids = setup_packets(stack.urls[0], 4, 300)
    load = Load(stack.urls, ids, users(450), concurrency=8, rate=70).start()
    time.sleep(1.0)
    pg.stop()
    try:
        time.sleep(3)
        ready = httpx.get(stack.urls[0] + "/readyz", timeout=5)
        assert ready.status_code == 503 and "database" in ready.text
        backlog_during = stack.backlog()
        time.sleep(17)
        backlog_peak = stack.backlog()
    finally:
        pg.start()
    result = load.wait(120)
    stack.wait_drained(90)
    outcome = measure(stack, "5. PostgreSQL stopped 20 s under load", result)
    print(f"   backlog 3 s into the outage: {backlog_during}, after 20 s: {backlog_peak}")
    assert backlog_peak > backlog_during > 0
    assert httpx.get(stack.urls[0] + "/readyz", timeout=5).status_code == 200
    assert outcome.lost == 0 and outcome.money_difference == 0
    audit_clean(stack)


def test_poison_entry(make_stack: Any) -> None:
    stack: Stack = make_stack()
    ids = setup_packets(stack.urls[0], 4, 250)
    load = Load(stack.urls, ids, users(300), rate=600).start()
    time.sleep(0.5)
    stack.redis.execute(
        "XADD", "hb:{b0}:ev", "*", "k", "c", "p", ids[0], "u", "mallory", "c", "not-a-claim"
    )
    result = load.wait()
    stack.wait_drained()
    outcome = measure(stack, "6. poison stream entry", result)
    assert dead_letters(stack) == 1
    assert outcome.lost == 0 and outcome.money_difference == 0
    assert "dead letter" in audit_clean(stack)


def test_expiry_during_grab_storm(make_stack: Any) -> None:
    stack: Stack = make_stack()
    (pid,) = setup_packets(stack.urls[0], 1, 600, total=600 * 100, expires_in=3)
    load = Load(stack.urls, [pid], users(900), concurrency=16, rate=200).start()
    result = load.wait()
    deadline = time.monotonic() + 30

    async def row() -> Any:
        ledger = SqlLedger.from_url(stack.database_url)
        try:
            async with ledger.engine.connect() as conn:
                return (
                    await conn.execute(
                        sa.select(
                            packets.c.total_amount,
                            packets.c.claimed_amount,
                            packets.c.refunded_amount,
                            packets.c.closed_at,
                        ).where(packets.c.id == pid)
                    )
                ).one()
        finally:
            await ledger.aclose()

    while (current := asyncio.run(row())).closed_at is None and time.monotonic() < deadline:
        time.sleep(0.3)
    stack.wait_drained()
    total, claimed, refunded, closed_at = asyncio.run(row())
    outcome = measure(stack, "7. expiry during a grab storm", result)
    print(f"   total {total} = claimed {claimed} + refunded {refunded}")
    assert current.closed_at is not None and closed_at is not None
    assert 0 < claimed < total and claimed + refunded == total
    assert result.refused > 0  # grabs after the expiry were refused
    assert outcome.lost == 0 and outcome.money_difference == 0
    audit_clean(stack)
