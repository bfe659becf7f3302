"""One persister batch on SQLite, PostgreSQL and MariaDB: each event judged in batch order,
the good ones applied by the batch's few set-based statements."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from hongbao.ledger import SqlLedger
from hongbao.ledger.bulk import ValuesBulk
from hongbao.ledger.schema import entries
from hongbao.ledger.sql import ClaimEvent, LedgerEvent, RefundEvent
from tests.ledger.test_ledger import record

AT = datetime(2026, 11, 26, 8, 0, 0, 123456, tzinfo=UTC)


async def packet(ledger: SqlLedger, amounts: list[int], sender: str = "s") -> str:
    await ledger.deposit(sender, sum(amounts), f"fund-{len(amounts)}-{sum(amounts)}")
    made, _ = await ledger.create_packet(record(sender, sum(amounts), len(amounts)), amounts, None)
    return made.id


async def test_replay_conflicting_user_wrong_amount_and_good_claim_in_one_batch(
    ledger: SqlLedger,
) -> None:
    pid = await packet(ledger, [100, 150, 50, 70])
    assert await ledger.apply([ClaimEvent(pid, 0, "u1", 100, AT)]) == [None]
    outcome = await ledger.apply(
        [
            ClaimEvent(pid, 0, "u1", 100, AT),  # a replay
            ClaimEvent(pid, 1, "u1", 150, AT),  # u1 holds share 0 already
            ClaimEvent(pid, 2, "u2", 49, AT),  # share 2 is 50 fen
            ClaimEvent(pid, 3, "u3", 70, AT),  # good
        ]
    )
    assert outcome[0] is None and outcome[3] is None
    assert outcome[1] == f"u1 already claimed share 0 of {pid}"
    assert outcome[2] == f"share 2 of {pid} is 50 fen, event says 49"
    assert [(c.user_id, c.share_idx) for c in await ledger.claims_of(pid)] == [
        ("u1", 0),
        ("u3", 3),
    ]
    assert (await ledger.balance("u1"), await ledger.balance("u3")) == (100, 70)
    after = await ledger.get_packet(pid)
    assert after is not None and (after.claimed_count, after.claimed_amount) == (2, 170)
    assert after.status == "active"
    assert await ledger.audit() == []


async def test_conflicts_inside_one_batch_go_to_the_first_event(ledger: SqlLedger) -> None:
    pid = await packet(ledger, [10, 20, 30, 40])
    outcome = await ledger.apply(
        [
            ClaimEvent(pid, 0, "a", 10, AT),
            ClaimEvent(pid, 0, "b", 10, AT),  # share 0 went to a just before
            ClaimEvent(pid, 1, "a", 20, AT),  # a took share 0 just before
            ClaimEvent(pid, 0, "a", 10, AT),  # the first event again: a replay
            ClaimEvent(pid, 2, "c", 31, AT),  # wrong amount: refused...
            ClaimEvent(pid, 2, "d", 30, AT),  # ...so share 2 is still free for d
            ClaimEvent(pid, 9, "e", 10, AT),  # no such share
        ]
    )
    assert outcome == [
        None,
        f"share 0 of {pid} was claimed by a",
        f"a already claimed share 0 of {pid}",
        None,
        f"share 2 of {pid} is 30 fen, event says 31",
        None,
        f"packet {pid} has no share 9",
    ]
    claimed = {(c.user_id, c.share_idx, c.amount) for c in await ledger.claims_of(pid)}
    assert claimed == {("a", 0, 10), ("d", 2, 30)}
    assert await ledger.audit() == []


@pytest.mark.parametrize(
    "before", ["replay", "share taken", "user served", "amount differs", "no such share"]
)
async def test_a_claim_the_ledger_has_refuses_the_unchecked_insert_and_the_rest_applies(
    ledger: SqlLedger, before: str
) -> None:
    """A batch of claims that conflict with none of each other is inserted without a
    lookup; one claim that is not new makes the unique keys refuse that insert, one that
    names its share wrong makes the share check refuse it, and then the batch is judged
    claim by claim, in the same transaction, as if it had been looked up first."""
    pid = await packet(ledger, [10, 20, 30, 40])
    assert await ledger.apply([ClaimEvent(pid, 1, "x", 20, AT)]) == [None]
    claim = {
        "replay": ClaimEvent(pid, 1, "x", 20, AT),
        "share taken": ClaimEvent(pid, 1, "y", 20, AT),
        "user served": ClaimEvent(pid, 3, "x", 40, AT),
        "amount differs": ClaimEvent(pid, 3, "y", 41, AT),
        "no such share": ClaimEvent(pid, 4, "y", 40, AT),
    }[before]
    outcome = await ledger.apply(
        [ClaimEvent(pid, 0, "a", 10, AT), claim, ClaimEvent(pid, 2, "c", 30, AT)]
    )
    assert outcome == [
        None,
        {
            "replay": None,
            "share taken": f"share 1 of {pid} was claimed by x",
            "user served": f"x already claimed share 1 of {pid}",
            "amount differs": f"share 3 of {pid} is 40 fen, event says 41",
            "no such share": f"packet {pid} has no share 4",
        }[before],
        None,
    ]
    claimed = {(c.user_id, c.share_idx) for c in await ledger.claims_of(pid)}
    assert claimed == {("x", 1), ("a", 0), ("c", 2)}
    assert [await ledger.balance(u) for u in ("a", "x", "c", "y")] == [10, 20, 30, 0]
    after = await ledger.get_packet(pid)
    assert after is not None and (after.claimed_count, after.claimed_amount) == (3, 60)
    assert await ledger.audit() == []


async def test_credits_add_up_per_user_and_counters_per_packet(ledger: SqlLedger) -> None:
    first = await packet(ledger, [5, 6, 7])
    second = await packet(ledger, [11, 12])
    batch: list[LedgerEvent] = [
        ClaimEvent(first, 0, "new-user", 5, AT),
        ClaimEvent(second, 1, "new-user", 12, AT),
        ClaimEvent(first, 1, "other", 6, AT),
        ClaimEvent(first, 2, "third", 7, AT),
        ClaimEvent("no-such-packet", 0, "x", 1, AT),
    ]
    outcome = await ledger.apply(batch)
    assert outcome[:4] == [None] * 4
    assert outcome[4] == "packet no-such-packet is not in the ledger"
    assert await ledger.balance("new-user") == 17  # a wallet created by the batch
    done, open_ = await ledger.get_packet(first), await ledger.get_packet(second)
    assert done is not None and open_ is not None
    assert (done.claimed_count, done.claimed_amount, done.status) == (3, 18, "exhausted")
    assert (open_.claimed_count, open_.claimed_amount, open_.status) == (1, 12, "active")
    claim = (await ledger.claims_of(first))[0]
    assert claim.claimed_at == AT  # microseconds kept
    assert await ledger.audit() == []


async def test_refund_after_the_batchs_claims_and_only_once(ledger: SqlLedger) -> None:
    pid = await packet(ledger, [40, 60], sender="boss")
    other = await packet(ledger, [30], sender="boss")
    before = await ledger.balance("boss")
    outcome = await ledger.apply(
        [
            RefundEvent(pid, "boss", 60, 1, AT),  # judged after the claim below
            ClaimEvent(pid, 0, "u", 40, AT),
            RefundEvent(pid, "boss", 60, 1, AT),  # the same refund again
            RefundEvent(other, "mallory", 30, 1, AT),  # not the sender
            RefundEvent(other, "boss", 31, 1, AT),  # more than the packet holds
        ]
    )
    assert outcome[:3] == [None, None, None]
    assert outcome[3] == f"refund of {other} names sender mallory, not boss"
    assert outcome[4] == f"refund of 31 fen for {other} would exceed its total (0 claimed of 30)"
    assert await ledger.balance("boss") == before + 60
    closed = await ledger.get_packet(pid)
    assert closed is not None and (closed.status, closed.refunded_amount) == ("expired", 60)
    assert closed.closed_at == AT
    assert await ledger.apply([RefundEvent(pid, "boss", 60, 1, AT)]) == [None]
    assert await ledger.balance("boss") == before + 60
    assert await ledger.audit() == []


async def test_a_refund_of_nothing_closes_the_packet_without_an_entry(ledger: SqlLedger) -> None:
    pid = await packet(ledger, [25])
    before = await ledger.balance("s")
    claim, close = ClaimEvent(pid, 0, "u", 25, AT), RefundEvent(pid, "s", 0, 0, AT)
    assert await ledger.apply([claim, close]) == [None, None]
    closed = await ledger.get_packet(pid)
    assert closed is not None and (closed.status, closed.refunded_amount) == ("exhausted", 0)
    assert await ledger.balance("s") == before
    assert await ledger.audit() == []


async def test_rows_beyond_the_parameter_limit_go_in_several_statements(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MariaDB and SQLite split a statement's rows under their bind-parameter limit
    (PostgreSQL binds one array a column); a small limit makes a small batch split."""
    monkeypatch.setattr(ValuesBulk, "max_params", 13)
    amounts = list(range(1, 41))
    pid = await packet(ledger, amounts)
    batch = [ClaimEvent(pid, i, f"user{i:02d}", a, AT) for i, a in enumerate(amounts)]
    batch.append(ClaimEvent(pid, 3, "late", 4, AT))
    outcome = await ledger.apply(batch)
    assert outcome[:-1] == [None] * 40
    assert outcome[-1] == f"share 3 of {pid} was claimed by user03"
    assert await ledger.apply(batch[:-1]) == [None] * 40  # all replays
    assert len(await ledger.claims_of(pid)) == 40
    assert await ledger.balance("user39") == 40
    assert await ledger.audit() == []


async def test_ledger_entries_keep_their_references(ledger: SqlLedger) -> None:
    pid = await packet(ledger, [30, 45], sender="boss")
    claims = [ClaimEvent(pid, 1, "u1", 45, AT), ClaimEvent(pid, 0, "u0", 30, AT)]
    assert await ledger.apply(claims) == [None, None]
    other = await packet(ledger, [20, 80], sender="boss")
    refund = RefundEvent(other, "boss", 100, 2, AT)
    assert await ledger.apply([refund]) == [None]
    async with ledger.engine.connect() as conn:
        rows = await conn.execute(
            sa.select(
                entries.c.reference, entries.c.kind, entries.c.user_id, entries.c.amount
            ).where(entries.c.packet_id.in_([pid, other]))
        )
        found = {tuple(r) for r in rows}
    assert found == {
        (f"send:{pid}", "send", "boss", -75),
        (f"send:{other}", "send", "boss", -100),
        (f"claim:{pid}:0", "claim", "u0", 30),
        (f"claim:{pid}:1", "claim", "u1", 45),
        (f"refund:{other}", "refund", "boss", 100),
    }
