"""A persister that starts takes over at once what a dead one left pending, when it can
tell that one is dead: its own name from a previous run, or ``<this host>-<pid>`` of a
process that is gone. Anything else waits for persister_claim_idle_ms, as before."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace

import pytest

from hongbao.persister import Persister, gone_from_this_host
from hongbao.service import Hongbao

pytestmark = [pytest.mark.redis, pytest.mark.integration]

SHARES = 40


@pytest.fixture
def dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    sleeper = subprocess.Popen(["sleep", "60"])
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait()


def test_gone_from_this_host(dead_pid: int, live_pid: int) -> None:
    host = socket.gethostname()
    assert gone_from_this_host(f"{host}-{dead_pid}")
    assert not gone_from_this_host(f"{host}-{live_pid}")
    assert not gone_from_this_host(f"{host}-{os.getpid()}")  # this very process
    assert not gone_from_this_host(f"another-host-{dead_pid}")
    assert not gone_from_this_host("serve")
    assert not gone_from_this_host(f"{host}-99999999999999999999")


async def left_pending(service: Hongbao, consumer: str) -> list[str]:
    """A packet grabbed out, its events read by `consumer`, which dies before applying."""
    await service.deposit("sender", SHARES * 10)
    packet = await service.send("sender", SHARES * 10, SHARES)
    for i in range(SHARES):
        await service.grab(packet.id, f"u{i}")
    events = await service.store.read_events(consumer, 10_000, 10)
    assert events
    return [e.id for e in events]


async def pending_of(service: Hongbao, consumer: str) -> int:
    counts = [await service.store.pending_consumers(b) for b in range(service.store.buckets)]
    return sum(c.get(consumer, 0) for c in counts)


@pytest.mark.parametrize("case", ["same-name", "dead-pid-here", "live-pid-here", "elsewhere"])
async def test_a_starting_persister_takes_over_only_what_is_surely_abandoned(
    service: Hongbao, case: str, dead_pid: int, live_pid: int
) -> None:
    settings = replace(service.settings, persister_claim_idle_ms=60_000, persister_consumer="")
    host = socket.gethostname()
    first, second = {
        "same-name": ("serve", "serve"),
        "dead-pid-here": (f"{host}-{dead_pid}", None),
        "live-pid-here": (f"{host}-{live_pid}", None),
        "elsewhere": (f"elsewhere-{dead_pid}", None),
    }[case]
    await left_pending(service, first)
    before = await pending_of(service, first)
    persister = Persister(service.store, service.ledger, settings, consumer=second)
    await persister.take_over()
    if case in ("same-name", "dead-pid-here"):
        assert persister.stats.reclaimed == before > 0
        assert persister.stats.applied == SHARES
        assert await service.store.backlog() == 0  # applied and acknowledged, at once
        assert await service.ledger.audit() == []
    else:  # maybe alive: its entries wait for the idle timeout
        assert persister.stats.reclaimed == 0
        assert await pending_of(service, first) == before
