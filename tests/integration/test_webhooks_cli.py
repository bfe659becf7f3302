"""`hongbao webhooks` commands as an operator runs them, as subprocesses: enable and
prune on each database, and dispatch delivering a SQLite ledger's queue to a real local
receiver; exit codes and messages."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import typer

from hongbao.cli.webhooks import parse_age
from hongbao.ledger import SqlLedger
from hongbao.ledger.webhook_store import WebhookStore
from hongbao.webhooks.endpoints import new_secret
from tests.api.serving import clean_env, command, run_cli
from tests.api.test_cli import assert_usage_error
from tests.ledger.test_outbox import add_endpoint, counts
from tests.ledger.test_webhook_leases import emit
from tests.ledger.test_webhook_prune import OLD, age
from tests.webhook_receiver import Receiver


async def test_enable_lets_a_disabled_endpoint_receive_and_retry_all_requeue(
    ledger: SqlLedger, sql_url: str
) -> None:
    await add_endpoint(ledger, "we_gone", ["claim.settled"])
    await emit(ledger, "p1", 1, 2)
    store = WebhookStore(ledger)
    await store.disable_endpoint("we_gone", "the receiver answered 410 Gone")
    url = ["--database-url", sql_url]
    # a disabled endpoint's parked deliveries stay parked
    assert "0 deliveries are due again" in run_cli("webhooks", "retry-all", *url).stderr

    done = run_cli("webhooks", "enable", "we_gone", *url)
    assert done.returncode == 0, done.stderr
    assert "endpoint we_gone is enabled" in done.stderr and "retry-all" in done.stderr
    endpoint = await store.endpoint("we_gone")
    assert endpoint is not None and (endpoint.enabled, endpoint.disabled_reason) == (True, None)
    assert (await store.stats()).parked == 2
    listed = run_cli("webhooks", "list", *url)
    assert "we_gone" in listed.stdout and "enabled" in listed.stdout, listed.stdout
    again = run_cli("webhooks", "enable", "we_gone", *url)
    assert again.returncode == 0, again.stderr

    done = run_cli("webhooks", "retry-all", *url)
    assert done.returncode == 0 and "2 deliveries are due again" in done.stderr, done.stderr
    stats = await store.stats()
    assert (stats.pending, stats.parked) == (2, 0)


async def test_a_delivery_of_several_events_is_listed_counted_and_retried_whole(
    ledger: SqlLedger, sql_url: str
) -> None:
    await add_endpoint(ledger, "we_batch", ["claim.settled"], batch_size=10)
    await emit(ledger, "p1", 1, 3)  # one commit: one delivery of three events
    store = WebhookStore(ledger)
    await store.disable_endpoint("we_batch", "the receiver answered 410 Gone")
    url = ["--database-url", sql_url]
    failed = run_cli("webhooks", "failed", *url)
    assert failed.returncode == 1 and "and 2 more" in failed.stdout, failed.stdout
    (row,) = await store.failed()
    assert (row.status, row.event_count) == ("parked", 3)
    assert "3 parked" in run_cli("webhooks", "list", *url).stdout

    assert run_cli("webhooks", "enable", "we_batch", *url).returncode == 0
    done = run_cli("webhooks", "retry", str(row.id), *url)
    assert done.returncode == 0, done.stderr
    stats = await store.stats()
    assert (stats.pending, stats.parked) == (3, 0)


async def test_enable_of_an_unknown_endpoint_is_an_error(ledger: SqlLedger, sql_url: str) -> None:
    await add_endpoint(ledger, "we_off", ["claim.settled"], enabled=False)
    done = run_cli("webhooks", "enable", "we_[bold]nothing", "--database-url", sql_url)
    assert_usage_error(done, "no webhook endpoint 'we_[bold]nothing'", "hongbao webhooks list")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    endpoint = await WebhookStore(ledger).endpoint("we_off")
    assert endpoint is not None and endpoint.enabled is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("60m", timedelta(hours=1)),
        ("1h", timedelta(hours=1)),
        ("3650d", timedelta(days=3650)),
    ],
)
def test_prune_ages(value: str, expected: timedelta) -> None:
    assert parse_age(value) == expected


@pytest.mark.parametrize(
    "value", ["", "30", "d", "30x", "30D", "1.5d", "-1d", "59m", "0h", "3651d", "9" * 30 + "d"]
)
def test_bad_prune_ages(value: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_age(value)


async def test_prune_deletes_what_is_due_and_on_a_bad_age_nothing(
    ledger: SqlLedger, sql_url: str
) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    await emit(ledger, "old", 1, 2)
    await age(ledger, "old", "delivered", OLD)
    await emit(ledger, "parked", 1, 1)
    await age(ledger, "parked", "parked", OLD)
    url = ["--database-url", sql_url]
    for bad in ("30", "59m", "3651d"):
        done = run_cli("webhooks", "prune", "--older-than", bad, *url)
        assert_usage_error(done, "--older-than", bad)
    assert_usage_error(run_cli("webhooks", "prune", *url), "--older-than")
    assert await counts(ledger) == (3, 3)

    done = run_cli("webhooks", "prune", "--older-than", "30d", *url)
    assert done.returncode == 0, done.stderr
    assert "deleted 2 delivered deliveries and 2 events" in done.stderr
    assert await counts(ledger) == (1, 1)
    assert (await WebhookStore(ledger).stats()).parked == 1


async def test_dispatch_delivers_the_queue_and_stops_on_sigterm(
    receiver: Receiver, tmp_path: Path
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.sqlite3'}"
    ledger = SqlLedger.from_url(url)
    try:
        await ledger.migrate()
        store = WebhookStore(ledger)
        endpoint = await store.create_endpoint(
            "we_r", receiver.url, ["claim.settled"], new_secret()
        )
        receiver.secrets = [endpoint.secret]
        await emit(ledger, "p1", 1, 3)
        await emit(ledger, "p2", 1, 2)
        dispatcher = await asyncio.create_subprocess_exec(
            *command(),
            *("webhooks", "dispatch", "--database-url", url),
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 30
            while (await store.stats()).delivered < 5:
                assert dispatcher.returncode is None, await dispatcher.communicate()
                assert time.monotonic() < deadline, "not delivered in 30 s"
                await asyncio.sleep(0.05)
            dispatcher.send_signal(signal.SIGTERM)
            out, err = (b.decode() for b in await asyncio.wait_for(dispatcher.communicate(), 30))
        finally:
            if dispatcher.returncode is None:
                dispatcher.kill()
                await dispatcher.wait()
        assert dispatcher.returncode == 0, out + err
        assert "Traceback" not in out + err
        assert "dispatch: running" in err and "dispatch: stopped" in err, err
        stats = await store.stats()
        assert (stats.pending, stats.delivered, stats.parked) == (0, 5, 0)
    finally:
        await ledger.aclose()
    assert receiver.refused == []
    assert all(r.verified_by == (0,) for r in receiver.got)
    by_packet: dict[str, list[int]] = {}
    for r in receiver.got:
        by_packet.setdefault(r.data["packet_id"], []).append(r.data["n"])
    assert by_packet == {"p1": [1, 2, 3], "p2": [1, 2]}


def test_dispatch_on_an_unmigrated_ledger_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "unmigrated.sqlite3"
    sqlite3.connect(path).close()
    done = run_cli("webhooks", "dispatch", "--database-url", f"sqlite:///{path}")
    assert_usage_error(done, "cannot read the webhook queue", "is the ledger migrated?")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""
