"""Dead letters: listing the events the persister parked, retrying them, setting them aside."""

from __future__ import annotations

import asyncio

import pytest

from hongbao import dead_letters
from hongbao.audit import audit
from hongbao.errors import InvalidRequest, StorageError
from hongbao.keys import dead_letter_key, events_key, resolved_key
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.storage.redis import Event
from tests.api.serving import clean_env, run_cli

pytestmark = [pytest.mark.integration]


async def _grant_parked_after_deliveries(service: Hongbao) -> tuple[str, str, dict[str, str]]:
    """A grab whose grant entry is parked as a crash-looping persister would park it
    (too many deliveries), before the ledger saw it: (packet id, user, entry fields)."""
    await service.deposit("s", 1000)
    packet = await service.send("s", 100, 3)
    await service.grab(packet.id, "u1")
    keys = service.store.keys(packet.id)
    ((entry_id, fields),) = await service.store.client.xrange(keys.events)
    await service.store.dead_letter(
        Event(keys.events, entry_id, dict(fields)), "not applied after 5 deliveries"
    )
    assert await service.store.client.xlen(keys.events) == 0
    return packet.id, "u1", dict(fields)


async def _malformed_entry_parked(service: Hongbao, persister: Persister) -> dead_letters.Parked:
    """A grant entry with a malformed line, parked by the persister."""
    await service.deposit("s", 1000)
    packet = await service.send("s", 100, 2)
    keys = service.store.keys(packet.id)
    await service.store.client.xadd(keys.events, {"k": "g", "p": packet.id, "c": "u7 nonsense"})
    await asyncio.wait_for(persister.drain(), 20)
    (entry,) = await dead_letters.parked(service.store)
    return entry


async def test_a_parked_grant_is_listed_retried_and_applied_once(
    service: Hongbao, persister: Persister
) -> None:
    packet_id, user, fields = await _grant_parked_after_deliveries(service)
    bucket = service.store.keys(packet_id).bucket

    (entry,) = await dead_letters.parked(service.store)
    assert (entry.bucket, entry.reason, entry.fields) == (
        bucket,
        "not applied after 5 deliveries",
        fields,
    )
    assert entry.ref == f"b{bucket}/{entry.entry_id}"
    assert (await service.wallet(user)).balance == 0  # the ledger never got it

    ((ref, new_id),) = await dead_letters.retry(service.store, [entry.ref])
    assert ref == entry.ref and new_id is not None
    assert await dead_letters.parked(service.store) == []
    ((back_id, back_fields),) = await service.store.client.xrange(events_key(bucket))
    assert (back_id, dict(back_fields)) == (new_id, fields)  # the event's fields, in order

    await asyncio.wait_for(persister.drain(), 20)
    claim = (await service.claims(packet_id)).claims[0]
    assert (await service.wallet(user)).balance == claim.amount > 0
    assert await service.ledger.audit() == []
    # retried again (say by an operator unsure it went through): still paid once
    await service.store.dead_letter(Event(events_key(bucket), new_id, fields), "retry test")
    await dead_letters.retry(service.store, None)
    await asyncio.wait_for(persister.drain(), 20)
    assert (await service.wallet(user)).balance == claim.amount
    assert await dead_letters.parked(service.store) == []
    assert await service.ledger.audit() == []


async def test_an_entry_that_still_fails_is_parked_again_with_its_reason(
    service: Hongbao, persister: Persister
) -> None:
    first = await _malformed_entry_parked(service, persister)
    assert "malformed" in first.reason

    await dead_letters.retry(service.store, None)
    await asyncio.wait_for(persister.drain(), 20)
    (again,) = await dead_letters.parked(service.store)
    assert again.entry_id != first.entry_id
    assert (again.reason, again.fields) == (first.reason, first.fields)
    assert await service.ledger.audit() == []


async def test_a_resolved_entry_is_kept_aside_with_its_note_and_never_applied(
    service: Hongbao, persister: Persister
) -> None:
    entry = await _malformed_entry_parked(service, persister)

    with pytest.raises(InvalidRequest, match="note"):
        await dead_letters.resolve(service.store, [entry.ref], "  ")
    assert await dead_letters.parked(service.store) == [entry]
    ((ref, new_id),) = await dead_letters.resolve(service.store, [entry.ref], "test garbage")
    assert ref == entry.ref and new_id is not None
    assert await dead_letters.parked(service.store) == []
    ((kept_id, kept),) = await service.store.client.xrange(resolved_key(entry.bucket))
    assert kept_id == new_id
    assert list(kept)[:4] == ["note", "resolved_at", "reason", "id"]
    assert kept["note"] == "test garbage" and int(kept["resolved_at"]) > 0
    assert (kept["reason"], kept["id"]) == (entry.reason, entry.event_id)
    assert {k: v for k, v in kept.items() if k in entry.fields} == entry.fields
    assert await service.store.client.xlen(events_key(entry.bucket)) == 0  # nothing to apply
    report = await audit(service, settle=0)
    assert report.clean and report.dead_letters == []
    assert await service.ledger.audit() == []


async def test_bad_names_change_nothing(service: Hongbao) -> None:
    packet_id, _, _ = await _grant_parked_after_deliveries(service)
    (entry,) = await dead_letters.parked(service.store)
    other_bucket = (entry.bucket + 1) % service.store.buckets
    for refs, message in [
        (["3-0"], "expected b<bucket>/<id>"),
        ([f"b{service.store.buckets}/{entry.entry_id}"], "only buckets"),
        ([entry.ref, f"b{other_bucket}/{entry.entry_id}"], "no dead-letter entry"),
        ([entry.ref, f"b{entry.bucket}/1-1"], f"b{entry.bucket}/1-1"),
    ]:
        with pytest.raises(InvalidRequest, match=message):
            await dead_letters.retry(service.store, refs)
        assert await dead_letters.parked(service.store) == [entry]  # nothing moved
    assert await service.store.client.xlen(service.store.keys(packet_id).events) == 0


async def test_the_script_refuses_an_entry_it_did_not_park(service: Hongbao) -> None:
    dlq = dead_letter_key(1)
    entry_id = await service.store.client.xadd(dlq, {"k": "g", "p": "x", "c": "u 1:1:1"})
    with pytest.raises(StorageError, match="not a parked event"):
        await service.store.retry_dead_letter(1, entry_id)
    assert await service.store.client.xlen(dlq) == 1
    assert await service.store.client.xlen(events_key(1)) == 0
    assert await service.store.retry_dead_letter(1, "1-1") is None
    parked_id = await service.store.client.xadd(dlq, {"reason": "r", "id": "1-0", "k": "g"})
    with pytest.raises(StorageError, match="unknown move"):
        await service.store._move_dead_letter(1, parked_id, events_key(1), "bogus")
    assert await service.store.client.xlen(dlq) == 2


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_cli_lists_retries_and_refuses_bad_input(service: Hongbao, redis_url: str) -> None:
    await _grant_parked_after_deliveries(service)
    (entry,) = await dead_letters.parked(service.store)
    entry_fields = {"reason": entry.reason, "id": entry.event_id, **entry.fields}
    env = {**clean_env(), "HONGBAO_BUCKETS": str(service.store.buckets)}

    def cli(*args: str) -> tuple[int, str]:
        done = run_cli("dead-letters", "--redis-url", redis_url, *args, env=env)
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, done.stdout + done.stderr

    code, text = cli()
    assert code == 1 and entry.ref in text and "not applied after 5 deliveries" in text
    assert "dead-letter entries: 1" in text
    for bad in (
        ["--retry", "b0/nope"],
        ["--retry", "b0/1-1"],
        ["--retry", "x", "--retry-all"],
        ["--retry", entry.ref, "--resolve", entry.ref, "--note", "n"],
        ["--resolve", entry.ref],
        ["--note", "why", "--retry-all"],
    ):
        code, text = cli(*bad)
        assert code == 2 and "error" in text, (bad, text)
    assert await dead_letters.parked(service.store) == [entry]

    code, text = cli("--retry-all")
    assert code == 0, text
    assert f"{entry.ref}: back on the event stream" in text and "dead-letter entries: 0" in text
    assert await dead_letters.parked(service.store) == []

    await service.store.client.xadd(dead_letter_key(entry.bucket), entry_fields)  # parked again
    (again,) = await dead_letters.parked(service.store)
    code, text = cli("--resolve", again.ref, "--note", "duplicate of the retried one")
    assert code == 0 and f"{again.ref}: resolved" in text, text
    assert await dead_letters.parked(service.store) == []
    assert await service.store.client.xlen(resolved_key(entry.bucket)) == 1


PARKED_FIELDS = {"reason": "malformed line", "id": "1-0", "k": "g", "p": "x", "c": "u nonsense"}


async def test_retry_all_moves_every_entry_past_the_listing_limit(
    service: Hongbao, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dead_letters, "LIMIT", 3)
    for bucket, n in ((0, 5), (2, 2)):
        for _ in range(n):
            await service.store.client.xadd(dead_letter_key(bucket), PARKED_FIELDS)
    assert len(await dead_letters.parked(service.store)) == 3
    assert await dead_letters.count(service.store) == 7

    moved = await dead_letters.retry(service.store, None)
    assert len(moved) == 7 and all(new_id is not None for _, new_id in moved)
    assert await dead_letters.count(service.store) == 0
    assert [await service.store.client.xlen(events_key(b)) for b in (0, 2)] == [5, 2]


async def test_an_entry_past_the_listing_is_retried_and_resolved_by_name(
    service: Hongbao, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dead_letters, "LIMIT", 2)
    ids = [await service.store.client.xadd(dead_letter_key(1), PARKED_FIELDS) for _ in range(4)]
    listed = {p.ref for p in await dead_letters.parked(service.store)}
    third, fourth = (dead_letters.entry_name(1, str(i)) for i in ids[2:])
    assert third not in listed and fourth not in listed
    (moved,) = await dead_letters.retry(service.store, [third])
    assert moved[0] == third and moved[1] is not None
    (set_aside,) = await dead_letters.resolve(service.store, [fourth], "test data")
    assert set_aside[0] == fourth and set_aside[1] is not None
    assert await dead_letters.count(service.store) == 2
    with pytest.raises(InvalidRequest, match="no dead-letter entry"):
        await dead_letters.retry(service.store, [third])  # moved: no longer parked


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_cli_counts_and_retries_more_entries_than_it_lists(
    service: Hongbao, redis_url: str
) -> None:
    shown = dead_letters.LIMIT
    pipe = service.store.client.pipeline(transaction=False)
    for _ in range(shown):
        pipe.xadd(dead_letter_key(0), PARKED_FIELDS)
    for _ in range(5):
        pipe.xadd(dead_letter_key(3), PARKED_FIELDS)
    await pipe.execute()
    env = {**clean_env(), "HONGBAO_BUCKETS": str(service.store.buckets)}

    done = run_cli("dead-letters", "--redis-url", redis_url, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stdout.count(": malformed line") == shown
    assert f"dead-letter entries: {shown + 5} (the first {shown} listed)" in done.stdout

    done = run_cli("dead-letters", "--redis-url", redis_url, "--retry-all", env=env, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert done.stdout.count(": back on the event stream") == shown + 5
    assert done.stdout.rstrip().endswith("dead-letter entries: 0")
    assert await service.store.client.xlen(events_key(3)) == 5
