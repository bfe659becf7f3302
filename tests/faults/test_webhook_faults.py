"""Webhooks under faults: a storm's events reach a real local receiver (every signature
checked with `standardwebhooks`) while the receiver is down, the dispatcher is killed
with SIGKILL, or PostgreSQL is stopped. Afterwards every claim in the ledger arrived,
nothing arrived that the ledger does not hold, and repeats carry the same webhook-id."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import packets
from tests.faults.conftest import (
    Load,
    PgCluster,
    Stack,
    kill_worker_repeatedly,
    ledger_claims,
    setup_packets,
    tokens,
)
from tests.webhook_receiver import Receiver

#: quick retries and a short lease (3 timeouts + 5 s), so a test waits seconds, not hours
FAST = {
    "HONGBAO_WEBHOOK_TIMEOUT": "2",
    "HONGBAO_WEBHOOK_MAX_BACKOFF": "2",
    "HONGBAO_WEBHOOK_POLL_INTERVAL": "0.05",
}
TYPES = ["claim.settled", "packet.exhausted"]


def users(n: int) -> list[str]:
    return [f"u{i}" for i in range(n)]


def register(stack: Stack, receiver: Receiver, batch_size: int = 1) -> None:
    (admin,) = tokens("admin", admin=True)
    r = httpx.post(
        stack.urls[0] + "/v1/webhooks",
        json={"url": receiver.url, "events": TYPES, "batch_size": batch_size},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    receiver.secrets = [r.json()["secret"]]


def ledger_state(stack: Stack) -> tuple[set[tuple[str, str, int, int]], set[str]]:
    """The ledger's claims (packet, user, seq, amount) and its exhausted packets."""

    async def run() -> tuple[set[tuple[str, str, int, int]], set[str]]:
        ledger = SqlLedger.from_url(stack.database_url)
        try:
            async with ledger.engine.connect() as conn:
                found = set(await ledger_claims(conn))
                done = set(
                    await conn.scalars(
                        sa.select(packets.c.id).where(packets.c.status == "exhausted")
                    )
                )
            return found, done
        finally:
            await ledger.aclose()

    return asyncio.run(run())


def settled(receiver: Receiver) -> set[tuple[str, str, int, int]]:
    return {
        (r.data["packet_id"], r.data["user_id"], r.data["seq"], r.data["amount"])
        for r in receiver.distinct("claim.settled").values()
    }


def everything_arrives(stack: Stack, receiver: Receiver, fault: str, within: float = 120) -> None:
    stack.wait_drained(90)
    in_ledger, exhausted = ledger_state(stack)
    deadline = time.monotonic() + within
    while settled(receiver) != in_ledger or len(receiver.distinct("packet.exhausted")) < len(
        exhausted
    ):
        assert settled(receiver) <= in_ledger, "an event for a claim the ledger does not hold"
        if time.monotonic() > deadline:
            worker = stack.worker.tail() if stack.worker else ""
            missing = len(in_ledger - settled(receiver))
            raise AssertionError(f"{missing} claims never arrived:\n{worker}")
        time.sleep(0.2)
    assert receiver.refused == []
    assert {r.data["packet_id"] for r in receiver.of_type("packet.exhausted")} == exhausted
    assert len(receiver.distinct("packet.exhausted")) == len(exhausted)
    for r in receiver.got:  # a repeat is the same event under the same webhook-id
        first = receiver.distinct()[r.id]
        assert (r.type, r.data) == (first.type, first.data)
    repeats = len(receiver.got) - len(receiver.distinct())
    print(
        f"\nWEBHOOKS {fault} | claims {len(in_ledger)} | delivered {len(receiver.distinct())}"
        f" | repeats {repeats}"
    )


@pytest.mark.parametrize("batch_size", [1, 100])
def test_receiver_down_20s_during_the_storm(
    make_stack: Any, receiver: Receiver, batch_size: int
) -> None:
    stack: Stack = make_stack(**FAST)
    register(stack, receiver, batch_size)
    ids = setup_packets(stack.urls[0], 4, 250)
    load = Load(stack.urls, ids, users(300), rate=500).start()
    time.sleep(1.0)
    receiver.stop()
    time.sleep(20)
    receiver.start()
    load.wait()
    everything_arrives(stack, receiver, f"receiver down 20 s, batches of {batch_size}")


@pytest.mark.parametrize("batch_size", [1, 100])
def test_dispatcher_killed_mid_delivery(
    make_stack: Any, receiver: Receiver, batch_size: int
) -> None:
    stack: Stack = make_stack(**FAST)
    register(stack, receiver, batch_size)
    ids = setup_packets(stack.urls[0], 4, 250)
    load = Load(stack.urls, ids, users(300), rate=500).start()
    kill_worker_repeatedly(stack, 3, every=1.0)
    load.wait()
    everything_arrives(stack, receiver, f"dispatcher kill -9 (x3), batches of {batch_size}")


def test_database_stopped_10s(make_stack: Any, receiver: Receiver, pg: PgCluster) -> None:
    stack: Stack = make_stack(**FAST)
    register(stack, receiver)
    ids = setup_packets(stack.urls[0], 4, 250)
    load = Load(stack.urls, ids, users(300), concurrency=8, rate=150).start()
    time.sleep(1.0)
    pg.stop()
    try:
        time.sleep(10)
        # nothing arrives for money the ledger does not hold, while it is away too
        arrived = settled(receiver)
    finally:
        pg.start()
    load.wait(120)
    in_ledger, _ = ledger_state(stack)
    assert arrived <= in_ledger
    everything_arrives(stack, receiver, "PostgreSQL stopped 10 s")
