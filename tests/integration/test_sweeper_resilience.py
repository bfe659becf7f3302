"""The background loops outlive an unexpected exception: the sweeper goes on refunding
expired packets, the persister settling grabs, and `running_service` starts a loop that
raised again; a worker that really stops still shows in `Runtime.workers_alive`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from hongbao import runtime as runtime_module
from hongbao.errors import StorageError
from hongbao.history import BestLuckIndexer
from hongbao.persister import Persister
from hongbao.runtime import running_service
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage import RedisStore
from hongbao.sweeper import Sweeper

pytestmark = [
    pytest.mark.redis,
    pytest.mark.integration,
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]


async def until(condition: Callable[[], bool], within: float = 15.0) -> None:
    """Wait for `condition` (polled), failing after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def failing_once(
    real: Callable[..., Any], error: Exception
) -> tuple[Callable[..., Any], list[int]]:
    """`real`, raising `error` on its first call; and a list that counts the calls."""
    calls: list[int] = []

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return await real(*args, **kwargs)

    return flaky, calls


async def expired_packet(service: Hongbao, sender: str = "sender") -> str:
    await service.deposit(sender, 1000)
    return (await service.send(sender, 300, 3, expires_in=1)).id


def logged_with_traceback(caplog: pytest.LogCaptureFixture, logger: str, text: str) -> bool:
    return any(
        r.name == logger and r.exc_info is not None and text in str(r.exc_info[1])
        for r in caplog.records
    )


async def test_the_sweeper_survives_a_failed_pass(
    service: Hongbao,
    persister: Persister,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pid = await expired_packet(service)
    await asyncio.sleep(1.1)  # expired: the failing pass is the one that would close it
    flaky, calls = failing_once(service.ledger.open_packets, RuntimeError("injected"))
    monkeypatch.setattr(service.ledger, "open_packets", flaky)
    sweeper, stop = Sweeper(service), asyncio.Event()
    task = asyncio.create_task(sweeper.run(stop))
    try:
        await until(lambda: sweeper.closed == 1 or task.done())
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert len(calls) >= 2 and sweeper.failures == 1
    assert logged_with_traceback(caplog, "hongbao.sweeper", "injected")
    await asyncio.wait_for(persister.drain(), 20)
    record = await service.ledger.get_packet(pid)
    assert record is not None and record.closed_at is not None
    assert record.refunded_amount == 300
    assert await service.ledger.audit() == []


async def test_a_packet_that_fails_to_close_holds_up_no_other(
    service: Hongbao, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    first = await expired_packet(service, "a")
    second = await expired_packet(service, "b")
    await asyncio.sleep(1.1)
    real = service.store.close_packet
    failed: list[str] = []

    async def close_packet(keys: Any, sender_id: str, retention_ms: int) -> Any:
        if sender_id == "a" and not failed:
            failed.append(sender_id)
            raise RuntimeError("injected")
        return await real(keys, sender_id, retention_ms)

    monkeypatch.setattr(service.store, "close_packet", close_packet)
    sweeper = Sweeper(service)
    assert first < second  # ids are time-ordered: the sweep meets the failing one first
    assert await sweeper.sweep_once() == 1  # the second one
    assert (failed, sweeper.failures) == (["a"], 1)
    assert logged_with_traceback(caplog, "hongbao.sweeper", "injected")
    assert await sweeper.sweep_once() == 1  # the first one, on the next pass
    assert await sweeper.sweep_once() == 0


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("ensure_groups", StorageError("redis: connection refused")),  # at the start
        ("read_events", RuntimeError("injected")),
    ],
    ids=["ensure_groups", "read_events"],
)
async def test_the_persister_survives_a_failed_step(
    service: Hongbao,
    persister: Persister,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    error: Exception,
) -> None:
    flaky, calls = failing_once(getattr(service.store, method), error)
    monkeypatch.setattr(service.store, method, flaky)
    await service.deposit("s", 1000)
    pid = (await service.send("s", 300, 3)).id
    stop = asyncio.Event()
    task = asyncio.create_task(persister.run(stop))
    try:
        await until(lambda: len(calls) >= 2 or task.done())
        await service.grab(pid, "u1")  # after the failure
        deadline = time.monotonic() + 15
        while not await service.ledger.claims_of(pid) and not task.done():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.05)
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert [c.user_id for c in await service.ledger.claims_of(pid)] == ["u1"]
    stats = persister.stats
    assert (stats.db_failures, stats.failures) == (
        (1, 0) if isinstance(error, StorageError) else (0, 1)
    )


async def test_a_worker_loop_that_raises_is_started_again(
    settings: Settings,
    store: RedisStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(runtime_module, "RESTART_DELAY", 0.05)
    flaky, calls = failing_once(BestLuckIndexer.run, RuntimeError("injected"))
    monkeypatch.setattr(BestLuckIndexer, "run", flaky)
    async with running_service(settings, workers=True) as runtime:
        (indexer,) = [t for t in runtime.tasks if t.get_name() == "hongbao-best-luck"]
        await until(lambda: len(calls) >= 2 or indexer.done())
        assert not indexer.done() and runtime.workers_alive()
        assert logged_with_traceback(caplog, "hongbao.runtime", "injected")
        indexer.cancel()  # a worker that really stops
        await asyncio.gather(indexer, return_exceptions=True)
        assert not runtime.workers_alive()
