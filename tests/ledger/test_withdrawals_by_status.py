"""Every user's withdrawals in one status, oldest first, on each database: the status
filter, the cutoff, the order (by the time requested, then id), pages that neither
repeat nor miss a withdrawal, the oldest one in flight and its metric."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hongbao.domain.withdrawals import StatusPage, Withdrawal, WithdrawalStatus
from hongbao.errors import InvalidRequest
from hongbao.ledger import SqlLedger
from hongbao.ledger.records import to_db
from hongbao.ledger.schema import withdrawals
from hongbao.metrics import WithdrawalTotals
from hongbao.withdrawals import MAX_OLDER_THAN, MAX_STATUS_PAGE, Withdrawals

REQUESTED, COMPLETED, FAILED = WithdrawalStatus
#: a whole second, so that every database keeps it exactly
T0 = datetime(2026, 11, 20, 8, 0, 0, tzinfo=UTC)


@pytest.fixture
def book(ledger: SqlLedger) -> Withdrawals:
    return Withdrawals(ledger)


async def requested_at(ledger: SqlLedger, withdrawal_id: str, moment: datetime) -> None:
    """Move a withdrawal's request to `moment`, as if it had been made then."""
    async with ledger.engine.begin() as conn:
        await conn.execute(
            withdrawals.update()
            .where(withdrawals.c.id == withdrawal_id)
            .values(created_at=to_db(moment), updated_at=to_db(moment))
        )


async def every_page(book: Withdrawals, status: WithdrawalStatus, limit: int) -> list[Withdrawal]:
    """Each page in turn, `limit` at a time; each but the last is full."""
    seen: list[Withdrawal] = []
    page = await book.in_status(status, limit=limit)
    while True:
        seen.extend(page.items)
        if page.next_after is None:
            return seen
        assert len(page.items) == limit
        page = await book.in_status(status, limit=limit, after=page.next_after)


async def many(ledger: SqlLedger, book: Withdrawals) -> list[Withdrawal]:
    """Nine requested withdrawals of three users, out of request order in time, three of
    them at one instant (their ids decide their order)."""
    for user in ("alice", "bob", "carol"):
        await ledger.deposit(user, 10_000, "d1")
    made = [
        (await book.request(("alice", "bob", "carol")[i % 3], 100 + i, f"w{i}"))[0]
        for i in range(9)
    ]
    minutes = [50, 10, 30, 30, 5, 30, 40, 20, 1]
    for w, ago in zip(made, minutes, strict=True):
        await requested_at(ledger, w.id, T0 - timedelta(minutes=ago))
    return [await book.get(w.id) for w in made]


def oldest_first(items: list[Withdrawal]) -> list[Withdrawal]:
    return sorted(items, key=lambda w: (w.created_at, w.id))


async def test_requested_oldest_first_across_users(ledger: SqlLedger, book: Withdrawals) -> None:
    made = await many(ledger, book)
    page = await book.in_status()
    assert isinstance(page, StatusPage) and page.status == REQUESTED
    assert page.items == oldest_first(made) and page.next_after is None
    assert {w.user_id for w in page.items} == {"alice", "bob", "carol"}
    ties = [w.id for w in page.items if w.created_at == T0 - timedelta(minutes=30)]
    assert len(ties) == 3 and ties == sorted(ties)


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 8, 9, 10])
async def test_pages_neither_repeat_nor_miss(
    ledger: SqlLedger, book: Withdrawals, limit: int
) -> None:
    made = await many(ledger, book)
    assert await every_page(book, REQUESTED, limit) == oldest_first(made)


async def test_status_filter(ledger: SqlLedger, book: Withdrawals) -> None:
    made = await many(ledger, book)
    done = [made[0], made[4], made[7]]
    bounced = [made[2], made[3]]
    for w in done:
        await book.complete(w.id, "paid")
    for w in bounced:
        await book.fail(w.id, "refused")
    left = [w for w in made if w not in done and w not in bounced]
    assert [w.id for w in await every_page(book, REQUESTED, 2)] == [
        w.id for w in oldest_first(left)
    ]
    completed = await every_page(book, COMPLETED, 2)
    assert [w.id for w in completed] == [w.id for w in oldest_first(done)]
    assert all(w.status == COMPLETED and w.note == "paid" for w in completed)
    failed = await book.in_status("failed")
    assert [w.id for w in failed.items] == [w.id for w in oldest_first(bounced)]
    assert failed.status == FAILED


async def test_cutoff(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    await ledger.deposit("bob", 1000, "d1")
    now = datetime.now(UTC)
    ages = {"3h": timedelta(hours=3), "2h": timedelta(hours=2), "30m": timedelta(minutes=30)}
    made = {}
    for i, (name, age) in enumerate(ages.items()):
        made[name] = (await book.request("alice" if i % 2 else "bob", 10, name))[0]
        await requested_at(ledger, made[name].id, now - age)
    made["now"] = (await book.request("alice", 10, "now"))[0]

    async def listed(older_than: int | None) -> list[str]:
        page = await book.in_status(older_than=older_than)
        return [w.id for w in page.items]

    assert await listed(3600) == [made["3h"].id, made["2h"].id]
    assert await listed(2 * 3600 + 60) == [made["3h"].id]
    assert await listed(3 * 3600 + 60) == []
    assert await listed(60) == [made[n].id for n in ("3h", "2h", "30m")]
    assert await listed(0) == await listed(None) == [made[n].id for n in ("3h", "2h", "30m", "now")]
    assert await listed(MAX_OLDER_THAN) == []
    # the cutoff with pages: one at a time, the same ones in the same order
    page = await book.in_status(older_than=3600, limit=1)
    second = await book.in_status(older_than=3600, limit=1, after=page.next_after)
    assert [w.id for w in page.items + second.items] == [made["3h"].id, made["2h"].id]
    assert second.next_after is None


async def test_changes_between_pages(ledger: SqlLedger, book: Withdrawals) -> None:
    """A withdrawal settled after its page was read leaves the list, one requested
    meanwhile joins its end, and the others are each listed once."""
    made = oldest_first(await many(ledger, book))
    first = await book.in_status(limit=3)
    assert first.items == made[:3]
    await book.complete(made[4].id)
    await book.fail(made[1].id)  # already listed
    late, _ = await book.request("alice", 5, "late")
    seen = list(first.items)
    page = first
    while page.next_after is not None:
        page = await book.in_status(limit=3, after=page.next_after)
        seen.extend(page.items)
    assert [w.id for w in seen] == [w.id for w in made if w != made[4]] + [late.id]


async def test_bad_arguments_are_refused(ledger: SqlLedger, book: Withdrawals) -> None:
    for kwargs, field in (
        ({"status": "lost"}, "status"),
        ({"status": ""}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": MAX_STATUS_PAGE + 1}, "limit"),
        ({"limit": True}, "limit"),
        ({"older_than": -1}, "older_than"),
        ({"older_than": 1.5}, "older_than"),
        ({"older_than": True}, "older_than"),
        ({"older_than": MAX_OLDER_THAN + 1}, "older_than"),
    ):
        with pytest.raises(InvalidRequest) as caught:
            await book.in_status(**kwargs)  # type: ignore[arg-type]
        assert caught.value.field == field, kwargs
    assert (await book.in_status(limit=MAX_STATUS_PAGE)).items == []


async def test_the_oldest_in_flight(ledger: SqlLedger, book: Withdrawals) -> None:
    assert await book.oldest_requested() is None
    made = oldest_first(await many(ledger, book))
    assert await book.oldest_requested() == made[0].created_at == T0 - timedelta(minutes=50)
    await book.complete(made[0].id)
    await book.fail(made[1].id)
    assert await book.oldest_requested() == made[2].created_at
    for w in made[2:]:
        await book.complete(w.id)
    assert await book.oldest_requested() is None


async def test_the_metric_of_the_oldest_in_flight(ledger: SqlLedger, book: Withdrawals) -> None:
    gauge = WithdrawalTotals()
    assert await gauge.refresh(book) and gauge.oldest_requested == 0.0
    await ledger.deposit("alice", 1000, "d1")
    old, _ = await book.request("alice", 100, "w1")
    young, _ = await book.request("alice", 100, "w2")
    await requested_at(ledger, old.id, datetime.now(UTC) - timedelta(hours=2))
    assert await gauge.refresh(book)
    assert gauge.oldest_requested == pytest.approx(7200, abs=30)
    await book.complete(old.id)
    assert await gauge.refresh(book)
    assert 0.0 < gauge.oldest_requested < 30
    await book.fail(young.id)
    assert await gauge.refresh(book) and gauge.oldest_requested == 0.0
