"""Withdrawals in the ledger: the debit, the outcome, the money back once, their events,
and the audit, on each database; retried and raced requests and reports change money once."""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa

from hongbao.domain.withdrawals import (
    MAX_WITHDRAWAL,
    Withdrawal,
    WithdrawalStatus,
    new_withdrawal_id,
)
from hongbao.errors import (
    HongbaoError,
    IdempotencyConflict,
    InsufficientBalance,
    InvalidRequest,
    WithdrawalAlreadyCompleted,
    WithdrawalAlreadyFailed,
    WithdrawalNotFound,
)
from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import entries, events, wallets, withdrawals
from hongbao.withdrawals import Withdrawals
from tests.ledger.test_outbox import add_endpoint

REQUESTED, COMPLETED, FAILED = WithdrawalStatus


@pytest.fixture
def book(ledger: SqlLedger) -> Withdrawals:
    return Withdrawals(ledger)


async def entry_rows(ledger: SqlLedger, user: str) -> list[tuple[str, str, int, str | None]]:
    """(reference, kind, amount, actor) of the user's entries, in order."""
    async with ledger.engine.connect() as conn:
        rows = await conn.execute(
            sa.select(entries.c.reference, entries.c.kind, entries.c.amount, entries.c.actor)
            .where(entries.c.user_id == user)
            .order_by(entries.c.id)
        )
        return [(r, k, int(a), actor) for r, k, a, actor in rows]


async def test_request_debits_at_once(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    w, created = await book.request("alice", 300, "w1", actor="payments")
    assert created and w.status == REQUESTED and (w.user_id, w.amount) == ("alice", 300)
    assert w.id.startswith("wd_") and w.actor == "payments" and w.note is None
    assert await ledger.balance("alice") == 700
    assert (await entry_rows(ledger, "alice"))[1:] == [
        (f"withdrawal:{w.id}", "withdrawal", -300, "payments")
    ]
    assert await book.get(w.id) == w
    assert await ledger.audit() == []


async def test_same_key_is_the_same_withdrawal(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    first, _ = await book.request("alice", 300, "w1")
    again, created = await book.request("alice", 300, "w1")
    assert again == first and not created
    with pytest.raises(IdempotencyConflict):
        await book.request("alice", 301, "w1")
    # the key is the user's: another user's same key is another withdrawal
    await ledger.deposit("bob", 500, "d1")
    bobs, created = await book.request("bob", 300, "w1")
    assert created and bobs.id != first.id
    assert (await ledger.balance("alice"), await ledger.balance("bob")) == (700, 200)
    assert await ledger.audit() == []


async def test_a_retry_is_answered_even_when_the_wallet_is_empty_now(
    ledger: SqlLedger, book: Withdrawals
) -> None:
    await ledger.deposit("alice", 300, "d1")
    first, _ = await book.request("alice", 300, "w1")
    assert await book.request("alice", 300, "w1") == (first, False)


async def test_refusals_change_nothing(ledger: SqlLedger, book: Withdrawals) -> None:
    with pytest.raises(InsufficientBalance):
        await book.request("nobody", 1, "w1")
    await ledger.deposit("alice", 100, "d1")
    with pytest.raises(InsufficientBalance):
        await book.request("alice", 101, "w1")
    for amount in (0, -5, MAX_WITHDRAWAL + 1, 1.5, True, "10"):
        with pytest.raises(InvalidRequest) as caught:
            await book.request("alice", amount, "w2")  # type: ignore[arg-type]
        assert caught.value.field == "amount"
    for key in ("", "k" * 129):
        with pytest.raises(InvalidRequest):
            await book.request("alice", 10, key)
    with pytest.raises(InvalidRequest):
        await book.request("not a user", 10, "w3")
    assert await ledger.balance("alice") == 100
    assert (await book.of_user("alice")).items == []
    # the refused key is free: it was never used
    _, created = await book.request("alice", 100, "w1")
    assert created and await ledger.balance("alice") == 0
    assert await ledger.audit() == []


async def test_complete(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    w, _ = await book.request("alice", 300, "w1")
    done, changed = await book.complete(w.id, "bank ref 42")
    assert changed and done.status == COMPLETED and done.note == "bank ref 42"
    assert done.updated_at >= w.updated_at
    again, changed = await book.complete(w.id, "another note")
    assert not changed and again == done
    with pytest.raises(WithdrawalAlreadyCompleted):
        await book.fail(w.id, "too late")
    assert await ledger.balance("alice") == 700
    assert await book.get(w.id) == done
    assert await ledger.audit() == []


async def test_fail_gives_the_money_back_once(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    w, _ = await book.request("alice", 300, "w1")
    failed, changed = await book.fail(w.id, "account closed", actor="payments")
    assert changed and failed.status == FAILED and failed.note == "account closed"
    assert await book.fail(w.id) == (failed, False)
    with pytest.raises(WithdrawalAlreadyFailed):
        await book.complete(w.id)
    assert await ledger.balance("alice") == 1000
    assert (await entry_rows(ledger, "alice"))[1:] == [
        (f"withdrawal:{w.id}", "withdrawal", -300, None),
        (f"reversal:{w.id}", "reversal", 300, "payments"),
    ]
    assert await ledger.audit() == []


async def test_unknown_and_malformed_ids(ledger: SqlLedger, book: Withdrawals) -> None:
    for bad in (new_withdrawal_id(), "wd_x", "", "x" * 1000, None):
        for call in (book.get, book.complete, book.fail):
            with pytest.raises(WithdrawalNotFound):
                await call(bad)  # type: ignore[arg-type]


async def test_notes_are_checked(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    w, _ = await book.request("alice", 300, "w1")
    for bad in ("x" * 201, "a\x00b", "\u202e", 5):
        with pytest.raises(InvalidRequest) as caught:
            await book.fail(w.id, bad)  # type: ignore[arg-type]
        assert caught.value.field == "note"
    assert (await book.get(w.id)).status == REQUESTED
    assert await ledger.balance("alice") == 700


async def test_list_newest_first_a_page_at_a_time(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    await ledger.deposit("bob", 1000, "d1")
    made = [(await book.request("alice", 10 + i, f"w{i}"))[0] for i in range(7)]
    await book.request("bob", 5, "w0")
    await book.fail(made[2].id)
    await book.complete(made[3].id)
    seen: list[Withdrawal] = []
    page = await book.of_user("alice", limit=3)
    while True:
        seen.extend(page.items)
        if page.next_after is None:
            break
        page = await book.of_user("alice", limit=3, after=page.next_after)
    expected = sorted(
        [await book.get(w.id) for w in made], key=lambda w: (w.created_at, w.id), reverse=True
    )
    assert seen == expected
    failed = await book.of_user("alice", status="failed")
    assert [w.id for w in failed.items] == [made[2].id] and failed.next_after is None
    with pytest.raises(InvalidRequest):
        await book.of_user("alice", status="lost")
    with pytest.raises(InvalidRequest):
        await book.of_user("alice", limit=0)


async def test_events_in_the_same_transaction(ledger: SqlLedger, book: Withdrawals) -> None:
    types = ["withdrawal.requested", "withdrawal.completed", "withdrawal.failed"]
    await add_endpoint(ledger, "we_a", types)
    await ledger.deposit("alice", 1000, "d1")
    one, _ = await book.request("alice", 300, "w1")
    two, _ = await book.request("alice", 200, "w2")
    await book.request("alice", 300, "w1")  # a retry: no second event
    await book.complete(one.id, "paid")
    await book.fail(two.id, "refused")
    await book.fail(two.id, "refused")
    with pytest.raises(InsufficientBalance):
        await book.request("alice", 10_000, "w3")  # refused: rolled back, no event
    async with ledger.engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.select(events.c.type, events.c.subject, events.c.payload).order_by(events.c.seq)
            )
        ).all()
    got = [(t, s, json.loads(p)) for t, s, p in rows]
    assert [(t, s) for t, s, _ in got] == [
        ("withdrawal.requested", f"withdrawal:{one.id}"),
        ("withdrawal.requested", f"withdrawal:{two.id}"),
        ("withdrawal.completed", f"withdrawal:{one.id}"),
        ("withdrawal.failed", f"withdrawal:{two.id}"),
    ]
    assert got[0][2] == {
        "id": one.id,
        "user_id": "alice",
        "amount": 300,
        "status": "requested",
        "created_at": got[0][2]["created_at"],
    }
    assert got[0][2]["created_at"].endswith("Z")
    assert got[2][2]["status"] == "completed" and got[2][2]["note"] == "paid"
    assert got[3][2]["status"] == "failed" and got[3][2]["note"] == "refused"
    assert got[3][2]["amount"] == 200 and got[3][2]["created_at"] == got[1][2]["created_at"]


async def test_audit_adds_withdrawals_in_every_state(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    requested, _ = await book.request("alice", 100, "w1")
    completed, _ = await book.request("alice", 200, "w2")
    failed, _ = await book.request("alice", 300, "w3")
    await book.complete(completed.id)
    await book.fail(failed.id)
    assert await ledger.balance("alice") == 700
    assert await ledger.audit() == []

    # a withdrawal marked failed without its money back
    async with ledger.engine.begin() as conn:
        await conn.execute(
            withdrawals.update().where(withdrawals.c.id == requested.id).values(status="failed")
        )
    problems = await ledger.audit()
    assert any(f"withdrawal {requested.id}" in p and "no reversal" in p for p in problems)
    assert any("1 reversal entries for 2 failed" in p for p in problems)
    assert any(p.startswith("money:") for p in problems)


async def test_audit_finds_entries_without_their_withdrawal(
    ledger: SqlLedger, book: Withdrawals
) -> None:
    await ledger.deposit("alice", 1000, "d1")
    w, _ = await book.request("alice", 100, "w1")
    async with ledger.engine.begin() as conn:
        await conn.execute(withdrawals.delete().where(withdrawals.c.id == w.id))
    problems = await ledger.audit()
    assert any("1 withdrawal entries for 0 withdrawals" in p for p in problems)
    assert any(p.startswith("money:") for p in problems)


async def test_audit_finds_a_wrong_debit(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    w, _ = await book.request("alice", 100, "w1")
    async with ledger.engine.begin() as conn:
        await conn.execute(
            entries.update().where(entries.c.reference == f"withdrawal:{w.id}").values(amount=-90)
        )
        await conn.execute(wallets.update().values(balance=910))
    problems = await ledger.audit()
    assert any(
        f"withdrawal {w.id}" in p and "debit entry is withdrawal of -90" in p for p in problems
    )


# -- retries and races ----------------------------------------------------------------------------


async def outcomes(calls: list[asyncio.Future[tuple[Withdrawal, bool]]]) -> list[object]:
    return list(await asyncio.gather(*calls, return_exceptions=True))


async def test_racing_retries_with_one_key_debit_once(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    got = await outcomes([book.request("alice", 300, "same") for _ in range(20)])  # type: ignore[misc]
    assert all(isinstance(g, tuple) for g in got), got
    results = [g for g in got if isinstance(g, tuple)]
    assert len({w.id for w, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert await ledger.balance("alice") == 700
    assert len(await entry_rows(ledger, "alice")) == 2
    assert await ledger.audit() == []


async def test_racing_retries_of_the_whole_balance_all_get_the_withdrawal(
    ledger: SqlLedger, book: Withdrawals
) -> None:
    """A retry that waited for the first request's debit finds the wallet empty: it must
    still answer the withdrawal the first one made, not insufficient_balance."""
    await ledger.deposit("alice", 300, "d1")
    got = await outcomes([book.request("alice", 300, "all") for _ in range(20)])  # type: ignore[misc]
    assert all(isinstance(g, tuple) for g in got), got
    assert len({g[0].id for g in got if isinstance(g, tuple)}) == 1
    assert await ledger.balance("alice") == 0
    assert await ledger.audit() == []


async def test_racing_fails_give_the_money_back_once(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    w, _ = await book.request("alice", 300, "w1")
    got = await outcomes([book.fail(w.id, "bounced") for _ in range(20)])  # type: ignore[misc]
    assert all(isinstance(g, tuple) for g in got), got
    assert sum(changed for _, changed in got) == 1  # type: ignore[misc]
    assert await ledger.balance("alice") == 1000
    reversals = [e for e in await entry_rows(ledger, "alice") if e[1] == "reversal"]
    assert reversals == [(f"reversal:{w.id}", "reversal", 300, None)]
    assert await ledger.audit() == []


async def test_complete_racing_fail_one_wins(ledger: SqlLedger, book: Withdrawals) -> None:
    await ledger.deposit("alice", 1000, "d1")
    for round_ in range(3):
        w, _ = await book.request("alice", 100, f"w{round_}")
        calls = [book.complete(w.id) if i % 2 else book.fail(w.id) for i in range(20)]
        got = await outcomes(calls)  # type: ignore[arg-type]
        final = (await book.get(w.id)).status
        won = [g for g in got if isinstance(g, tuple)]
        lost = [g for g in got if isinstance(g, HongbaoError)]
        assert len(won) + len(lost) == 20, got
        assert sum(changed for _, changed in won) == 1
        assert all(w2.status == final for w2, _ in won)
        expected = WithdrawalAlreadyCompleted if final == COMPLETED else WithdrawalAlreadyFailed
        assert len(won) == 10 and all(isinstance(e, expected) for e in lost)
    assert await ledger.audit() == []
