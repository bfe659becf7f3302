"""The red-packet record, a wallet's entries and the daily statement, on each database.

The ledger is written through its own write paths (`create_packet`, `apply`), with claim
and packet times chosen by the test, so that ties and years are exact."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from hongbao.domain.history import Keyset
from hongbao.domain.ids import new_packet_id
from hongbao.domain.moments import ms
from hongbao.errors import InvalidRequest
from hongbao.history import BestLuckIndexer, History
from hongbao.ledger import SqlLedger
from hongbao.ledger.history import MARK_MARGIN
from hongbao.ledger.records import ClaimEvent, PacketRecord, RefundEvent, utcnow
from hongbao.ledger.schema import best_luck, entries, history_marks

YEAR = 2025
T0 = datetime(YEAR, 6, 1, 12, 0, tzinfo=UTC)
_refs = itertools.count()


async def open_packet(
    ledger: SqlLedger,
    sender: str,
    amounts: Sequence[int],
    *,
    mode: str = "lucky",
    created_at: datetime = T0,
    greeting: str = "",
) -> PacketRecord:
    """A packet in the ledger, its sender funded for it first."""
    total = sum(amounts)
    await ledger.deposit(sender, total, f"fund-{next(_refs)}")
    record = PacketRecord(
        id=new_packet_id(ms(created_at)),
        sender_id=sender,
        total_amount=total,
        count=len(amounts),
        mode=mode,
        greeting=greeting,
        status="active",
        created_at=created_at,
        expires_at=created_at + timedelta(days=1),
        request_hash="h",
    )
    made, created = await ledger.create_packet(record, list(amounts), None)
    assert created
    return made


async def grab(
    ledger: SqlLedger, packet: PacketRecord, idx: int, user: str, at: datetime, amount: int
) -> None:
    assert await ledger.apply([ClaimEvent(packet.id, idx, user, amount, at)]) == [None]


async def close(ledger: SqlLedger, packet: PacketRecord, left: int, shares_left: int) -> None:
    event = RefundEvent(packet.id, packet.sender_id, left, shares_left, packet.expires_at)
    assert await ledger.apply([event]) == [None]


async def walk(read: Any, limit: int, between: Any = None) -> list[Any]:
    """Every item of every page, following `next_after`; `between` runs after each page."""
    items: list[Any] = []
    after = None
    while True:
        page = await read(after=after, limit=limit)
        assert len(page.items) <= limit
        items.extend(page.items)
        if page.next_after is None:
            return items
        assert len(page.items) == limit
        after = page.next_after
        if between is not None:
            await between()


async def test_received_totals_and_best_luck(ledger: SqlLedger) -> None:
    history = History(ledger)
    s = T0
    # finished: a tie on amount goes to the earlier grab (carol, 1 s before bob)
    p1 = await open_packet(ledger, "alice", [100, 300, 300], greeting="恭喜发财")
    await grab(ledger, p1, 0, "dave", s, 100)
    await grab(ledger, p1, 2, "carol", s + timedelta(seconds=1), 300)
    await grab(ledger, p1, 1, "bob", s + timedelta(seconds=2), 300)
    # finished: a tie on amount and time goes to the lower share index (bob's)
    p2 = await open_packet(ledger, "alice", [200, 200], created_at=s + timedelta(minutes=1))
    await grab(ledger, p2, 1, "carol", s + timedelta(seconds=3), 200)
    await grab(ledger, p2, 0, "bob", s + timedelta(seconds=3), 200)
    # open: the largest share, but the packet is not finished
    p3 = await open_packet(ledger, "alice", [500, 1], created_at=s + timedelta(minutes=2))
    await grab(ledger, p3, 0, "bob", s + timedelta(seconds=4), 500)
    # finished, equal shares: no best luck
    p4 = await open_packet(
        ledger, "alice", [150, 150], mode="equal", created_at=s + timedelta(minutes=3)
    )
    await grab(ledger, p4, 0, "bob", s + timedelta(seconds=5), 150)
    await grab(ledger, p4, 1, "carol", s + timedelta(seconds=6), 150)
    # expired and closed with one claim: its only claim is the best luck
    p5 = await open_packet(ledger, "alice", [50, 70, 30], created_at=s + timedelta(minutes=4))
    await grab(ledger, p5, 1, "bob", s + timedelta(seconds=7), 70)
    await close(ledger, p5, 80, 2)
    # a year earlier: in that year's record only
    p6 = await open_packet(ledger, "alice", [9], created_at=s - timedelta(days=365))
    await grab(ledger, p6, 0, "bob", s - timedelta(days=365), 9)

    bob = await history.received("bob", YEAR)
    assert [r.packet_id for r in bob.items] == [p5.id, p4.id, p3.id, p2.id, p1.id]
    assert [(r.amount, r.best_luck) for r in bob.items] == [
        (70, True),
        (150, False),
        (500, False),
        (200, True),
        (300, False),
    ]
    first = bob.items[-1]
    assert (first.sender_id, first.greeting, first.mode) == ("alice", "恭喜发财", "lucky")
    assert first.claimed_at == s + timedelta(seconds=2)
    assert (bob.totals.count, bob.totals.amount, bob.totals.best_luck_count) == (5, 1220, 2)
    assert bob.next_after is None and bob.year == YEAR
    carol = await history.received("carol", YEAR)
    assert [(r.packet_id, r.best_luck) for r in carol.items] == [
        (p4.id, False),
        (p2.id, False),
        (p1.id, True),
    ]
    assert carol.totals.best_luck_count == 1
    earlier = await history.received("bob", YEAR - 1)
    assert [r.packet_id for r in earlier.items] == [p6.id]
    assert earlier.totals.best_luck_count == 1  # a one-share packet, exhausted
    assert (await history.received("nobody", YEAR)).totals.count == 0

    # the totals are the sums of the rows, whatever the page size
    for limit in (1, 2, 500):
        rows = await walk(lambda **kw: history.received("bob", YEAR, **kw), limit)
        assert len(rows) == bob.totals.count
        assert sum(r.amount for r in rows) == bob.totals.amount
        assert sum(r.best_luck for r in rows) == bob.totals.best_luck_count

    sent = await history.sent("alice", YEAR)
    assert [p.packet_id for p in sent.items] == [p5.id, p4.id, p3.id, p2.id, p1.id]
    assert (sent.totals.count, sent.totals.amount, sent.totals.refunded) == (5, 2051, 80)
    p5_row = sent.items[0]
    assert (p5_row.status, p5_row.claimed_count, p5_row.claimed_amount) == ("expired", 1, 70)
    assert (p5_row.total_amount, p5_row.count, p5_row.refunded_amount) == (150, 3, 80)
    assert [p.status for p in sent.items[1:]] == ["exhausted", "active", "exhausted", "exhausted"]
    for limit in (1, 3):
        rows = await walk(lambda **kw: history.sent("alice", YEAR, **kw), limit)
        assert [r.packet_id for r in rows] == [p.packet_id for p in sent.items]
        assert sum(r.total_amount for r in rows) == sent.totals.amount

    # the best-luck index changes no answer: before it ran, while a packet is open (its
    # claims are then counted claim by claim), and once every packet finished
    async def best_counts() -> list[int]:
        asked = [("bob", YEAR), ("carol", YEAR), ("bob", YEAR - 1)]
        return [(await history.received(u, y)).totals.best_luck_count for u, y in asked]

    assert await best_counts() == [2, 1, 1]
    indexer = BestLuckIndexer(ledger, batch=2)
    assert await indexer.catch_up() == 5  # all but the open p3
    assert await best_counts() == [2, 1, 1]
    await grab(ledger, p3, 1, "dave", s + timedelta(seconds=9), 1)  # now bob's 500 is best
    assert await best_counts() == [3, 1, 1]
    assert await indexer.catch_up() == 1
    assert await best_counts() == [3, 1, 1]
    rows = await walk(lambda **kw: history.received("bob", YEAR, **kw), 2)
    assert sum(r.best_luck for r in rows) == 3
    async with ledger.engine.connect() as conn:
        winners = dict(
            (await conn.execute(sa.select(best_luck.c.packet_id, best_luck.c.user_id))).all()
        )
        mark = await conn.scalar(sa.select(history_marks.c.at))
    assert winners == {
        p1.id: "carol",
        p2.id: "bob",
        p3.id: "bob",
        p4.id: None,
        p5.id: "bob",
        p6.id: "bob",
    }
    assert abs(mark - (utcnow() - MARK_MARGIN)) < timedelta(minutes=1)  # nothing open


async def test_pages_under_concurrent_claims_neither_skip_nor_repeat(ledger: SqlLedger) -> None:
    history = History(ledger)
    moments = [T0 + timedelta(seconds=i // 4) for i in range(40)]  # four claims per moment
    made = [await open_packet(ledger, "s", [10 + i]) for i in range(len(moments) + 30)]
    for packet, at in zip(made, moments, strict=False):
        await grab(ledger, packet, 0, "walker", at, packet.total_amount)
    before = {
        r.packet_id for r in await walk(lambda **kw: history.received("walker", YEAR, **kw), 500)
    }
    assert len(before) == len(moments)
    spare = iter(made[len(moments) :])

    async def arrive() -> None:
        """Three more claims: at the newest moment, at a moment already seen (same time,
        higher id) and one older than every other."""
        for at in (
            moments[-1] + timedelta(seconds=5),
            moments[len(moments) // 2],
            T0 - timedelta(1),
        ):
            packet = next(spare)
            await grab(ledger, packet, 0, "walker", at, packet.total_amount)

    seen = await walk(lambda **kw: history.received("walker", YEAR, **kw), 7, between=arrive)
    ids = [r.packet_id for r in seen]
    assert len(ids) == len(set(ids)), "a row came twice"
    assert before <= set(ids), "a row was skipped"
    positions = [r.position for r in seen]
    assert positions == sorted(positions, reverse=True)

    # the same while a writer keeps adding claims concurrently
    async def writer() -> None:
        for _ in range(3):
            await arrive()
            await asyncio.sleep(0)

    made_more = [await open_packet(ledger, "s", [5]) for _ in range(9)]
    spare = iter(made_more)
    again, _ = await asyncio.gather(
        walk(lambda **kw: history.received("walker", YEAR, **kw), 5), writer()
    )
    ids = [r.packet_id for r in again]
    assert len(ids) == len(set(ids)), "a row came twice"
    assert {r.packet_id for r in seen} <= set(ids), "a row was skipped"


async def test_sent_pages_with_equal_times_and_new_packets(ledger: SqlLedger) -> None:
    history = History(ledger)
    first = [
        await open_packet(ledger, "sender", [3], created_at=T0 + timedelta(seconds=i // 3))
        for i in range(14)
    ]

    async def send_more() -> None:
        await open_packet(ledger, "sender", [4], created_at=T0 + timedelta(seconds=30))
        await open_packet(ledger, "sender", [4], created_at=T0 + timedelta(seconds=2))

    seen = await walk(lambda **kw: history.sent("sender", YEAR, **kw), 4, between=send_more)
    ids = [p.packet_id for p in seen]
    assert len(ids) == len(set(ids))
    assert {p.id for p in first} <= set(ids)


async def test_entries_with_the_balance_after_each(ledger: SqlLedger) -> None:
    history = History(ledger)
    now = datetime.now(UTC)
    await ledger.deposit("ann", 1000, "d1")
    packet = await open_packet(ledger, "ben", [100, 200, 300], created_at=now)
    await grab(ledger, packet, 1, "ann", now, 200)
    mine = await open_packet(ledger, "ann", [40, 60], created_at=now)
    await grab(ledger, mine, 0, "ann", now, 40)
    await close(ledger, mine, 60, 1)
    await ledger.deposit("ann", 5, "d2")

    page = await history.entries("ann")
    kinds = [e.kind for e in page.items]
    assert kinds == ["deposit", "refund", "claim", "send", "deposit", "claim", "deposit"]
    # "fund-" deposit of open_packet comes before the send
    amounts = [e.amount for e in page.items]
    assert amounts == [5, 60, 40, -100, 100, 200, 1000]
    balances = [e.balance_after for e in page.items]
    assert balances == [1305, 1300, 1240, 1200, 1300, 1200, 1000]
    assert page.balance == 1305 == await ledger.balance("ann")
    assert page.items[2].packet_id == mine.id and page.items[2].reference.startswith("claim:")
    assert page.next_after is None

    for limit in (1, 2, 3):
        rows = await walk(lambda **kw: history.entries("ann", **kw), limit)
        assert [(e.id, e.balance_after) for e in rows] == [
            (e.id, e.balance_after) for e in page.items
        ]
    for kind in ("deposit", "claim", "refund", "send"):
        expected = [(e.id, e.balance_after) for e in page.items if e.kind == kind]
        for limit in (1, 2):
            rows = await walk(lambda k=kind, **kw: history.entries("ann", kind=k, **kw), limit)
            assert [(e.id, e.balance_after) for e in rows] == expected
    assert (await history.entries("nobody")).items == []


async def test_bad_input_names_its_field(ledger: SqlLedger) -> None:
    history = History(ledger)
    for call, field in [
        (history.received("bob", 1969), "year"),
        (history.received("bob", 10_000), "year"),
        (history.received("bob", 2026, limit=0), "limit"),
        (history.received("bob", 2026, limit=501), "limit"),
        (history.received("bob", 2026, after=Keyset(5, "x")), "cursor"),
        (history.received("bad user!", 2026), "user_id"),
        (history.sent("bob", 2026, after=Keyset(5, 3)), "cursor"),
        (history.sent("bob", 2026, after=Keyset(-1, new_packet_id())), "cursor"),
        (history.entries("bob", kind="gift"), "kind"),
        (history.entries("bob", after=0), "cursor"),
    ]:
        with pytest.raises(InvalidRequest) as err:
            await call
        assert err.value.field == field


async def move_entries(ledger: SqlLedger, user: str, moment: datetime) -> None:
    async with ledger.engine.begin() as conn:
        await conn.execute(
            entries.update().where(entries.c.user_id == user).values(created_at=moment)
        )


async def test_statement_of_a_day_balances_and_a_tampered_entry_breaks_it(
    ledger: SqlLedger,
) -> None:
    history = History(ledger)
    today = utcnow().date()
    midnight = datetime(today.year, today.month, today.day)
    # yesterday: carol's money; tomorrow (as the ledger will see it): dan's
    await ledger.deposit("carol", 700, "c1")
    await move_entries(ledger, "carol", midnight - timedelta(hours=1))
    await ledger.deposit("dan", 30, "x")
    await move_entries(ledger, "dan", midnight + timedelta(days=1, minutes=1))
    # today: a deposit, a send, grabs, a refund
    packet = await open_packet(ledger, "erin", [100, 150, 250], created_at=datetime.now(UTC))
    await grab(ledger, packet, 0, "carol", datetime.now(UTC), 100)
    await grab(ledger, packet, 2, "frank", datetime.now(UTC), 250)
    await close(ledger, packet, 150, 1)
    await ledger.deposit("frank", 1, "f1")
    assert await ledger.audit() == []

    st = await history.statement(today)
    assert st.balanced and st.difference == 0 and st.wallets_off == []
    assert (st.start, st.entries, st.end) == (700, 501, 1201)
    assert {(k.kind, k.count, k.amount) for k in st.by_kind} == {
        ("deposit", 2, 501),
        ("send", 1, -500),
        ("claim", 2, 350),
        ("refund", 1, 150),
    }
    assert sum(k.amount for k in st.by_kind) == st.entries == sum(x.amount for x in st.lines)
    assert {x.user_id for x in st.lines} == {"erin", "carol", "frank"}
    assert [x.created_at for x in st.lines] == sorted(x.created_at for x in st.lines)
    yesterday = await history.statement(today - timedelta(days=1))
    assert (yesterday.start, yesterday.entries, yesterday.end) == (0, 700, 700)
    assert yesterday.balanced

    # an entry of the day changed afterwards: the day no longer adds up, and says where
    async with ledger.engine.begin() as conn:
        await conn.execute(
            entries.update()
            .where(entries.c.user_id == "frank", entries.c.kind == "claim")
            .values(amount=entries.c.amount + 1)
        )
    st = await history.statement(today)
    assert not st.balanced and st.difference == -1
    assert [(w.user_id, w.start, w.entries, w.end) for w in st.wallets_off] == [
        ("frank", 0, 252, 251)
    ]
    # and so does one before the day, for the day after it
    async with ledger.engine.begin() as conn:
        await conn.execute(
            entries.update().where(entries.c.user_id == "carol").values(amount=sa.literal(1))
        )
    assert not (await history.statement(today)).balanced
