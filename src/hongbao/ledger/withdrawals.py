"""Withdrawals in the ledger: the debit when one is requested, its outcome, and the
money back when it failed.

Each change is one transaction (run by `SqlLedger.transaction`) that writes a ledger
entry with a unique reference next to the balance it changes and emits its event in the
outbox: `withdrawal:<id>` debits the wallet (a conditional UPDATE, so concurrent debits
never take it below zero), `reversal:<id>` credits a failed withdrawal's money back.
The outcome is set by an UPDATE conditional on the status still being `requested`, so of
concurrent reports exactly one changes anything.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.domain.withdrawals import (
    StatusPage,
    Withdrawal,
    WithdrawalPosition,
    WithdrawalsPage,
    WithdrawalStatus,
)
from hongbao.errors import (
    IdempotencyConflict,
    InsufficientBalance,
    WithdrawalAlreadyCompleted,
    WithdrawalAlreadyFailed,
    WithdrawalNotFound,
)
from hongbao.ledger.bulk import bulk_for
from hongbao.ledger.history import from_micros, micros
from hongbao.ledger.outbox import OutboxEvent, record_events, timestamp, withdrawal_subject
from hongbao.ledger.records import entry_row, from_db, to_db, utcnow
from hongbao.ledger.schema import entries, wallets, withdrawals

REQUESTED = WithdrawalStatus.REQUESTED.value
COMPLETED = WithdrawalStatus.COMPLETED.value
FAILED = WithdrawalStatus.FAILED.value

_COLUMNS = [
    withdrawals.c.id,
    withdrawals.c.user_id,
    withdrawals.c.amount,
    withdrawals.c.status,
    withdrawals.c.created_at,
    withdrawals.c.updated_at,
    withdrawals.c.outcome_note,
    withdrawals.c.actor,
]


def debit_reference(withdrawal_id: str) -> str:
    return f"withdrawal:{withdrawal_id}"


def reversal_reference(withdrawal_id: str) -> str:
    return f"reversal:{withdrawal_id}"


async def request(
    conn: AsyncConnection,
    withdrawal_id: str,
    user_id: str,
    amount: int,
    idempotency_key: str,
    actor: str | None = None,
) -> tuple[Withdrawal, bool]:
    """Debit the wallet and record the withdrawal, or return the one the user asked for
    with this key before (created=False); IdempotencyConflict if that one was of another
    amount, InsufficientBalance if the wallet holds less than `amount`.

    Two requests with one key racing each other both get past the first lookup, and the
    second waits for the first's debit of the wallet row. If the wallet then holds
    enough, the second debits too, but its insert breaks the unique (user, key): its
    transaction rolls back and, run again, finds the first. If it holds too little, the
    second looks again (the first has committed by then) and finds the first."""
    earlier = await _earlier(conn, user_id, idempotency_key, amount)
    if earlier is not None:
        return earlier, False
    now = utcnow()
    debited = await conn.execute(
        wallets.update()
        .where(wallets.c.user_id == user_id, wallets.c.balance >= amount)
        .values(balance=wallets.c.balance - amount, updated_at=now)
    )
    if debited.rowcount != 1:
        earlier = await _earlier(conn, user_id, idempotency_key, amount)
        if earlier is not None:
            return earlier, False
        raise InsufficientBalance(f"wallet of {user_id} holds less than {amount} fen")
    await conn.execute(
        entries.insert(),
        [entry_row(debit_reference(withdrawal_id), user_id, "withdrawal", -amount, actor=actor)],
    )
    await conn.execute(
        withdrawals.insert().values(
            id=withdrawal_id,
            user_id=user_id,
            amount=amount,
            status=REQUESTED,
            idempotency_key=idempotency_key,
            actor=actor,
            created_at=now,
            updated_at=now,
        )
    )
    made = Withdrawal(
        withdrawal_id,
        user_id,
        amount,
        WithdrawalStatus.REQUESTED,
        from_db(now),
        from_db(now),
        actor=actor,
    )
    await record_events(conn, [_event("withdrawal.requested", made)])
    return made, True


async def _earlier(
    conn: AsyncConnection, user_id: str, idempotency_key: str, amount: int
) -> Withdrawal | None:
    """The withdrawal the user asked for with this key before (None: none), read afresh;
    IdempotencyConflict if it was of another amount."""
    row = (
        await conn.execute(
            _select(withdrawals.c.user_id == user_id).where(
                withdrawals.c.idempotency_key == idempotency_key
            )
        )
    ).first()
    if row is None:
        return None
    found = _from_row(row)
    if found.amount != amount:
        raise IdempotencyConflict(
            "this Idempotency-Key was used before for a withdrawal of another amount"
        )
    return found


async def settle(
    conn: AsyncConnection,
    withdrawal_id: str,
    outcome: WithdrawalStatus,
    note: str | None = None,
    actor: str | None = None,
) -> tuple[Withdrawal, bool]:
    """Set a requested withdrawal's outcome (COMPLETED or FAILED); a failed one's money
    goes back to the wallet. Reporting the outcome it has already changes nothing
    (changed=False); reporting the other one is WithdrawalAlreadyCompleted or
    WithdrawalAlreadyFailed. `actor` (who reported it) is recorded on the reversal."""
    now = utcnow()
    changed = await conn.execute(
        withdrawals.update()
        .where(withdrawals.c.id == withdrawal_id, withdrawals.c.status == REQUESTED)
        .values(status=outcome.value, updated_at=now, outcome_note=note)
    )
    row = (await conn.execute(_select(withdrawals.c.id == withdrawal_id))).first()
    if row is None:
        raise WithdrawalNotFound(f"no withdrawal {withdrawal_id}")
    found = _from_row(row)
    if changed.rowcount != 1:
        if found.status == outcome:
            return found, False
        if found.status == WithdrawalStatus.COMPLETED:
            raise WithdrawalAlreadyCompleted(
                f"withdrawal {withdrawal_id} was completed: its money left the wallet"
            )
        raise WithdrawalAlreadyFailed(
            f"withdrawal {withdrawal_id} failed: its money went back to the wallet"
        )
    if outcome == WithdrawalStatus.FAILED:
        await bulk_for(conn).credit([found.user_id], [found.amount], now)
        await conn.execute(
            entries.insert(),
            [
                entry_row(
                    reversal_reference(withdrawal_id),
                    found.user_id,
                    "reversal",
                    found.amount,
                    actor=actor,
                )
            ],
        )
    await record_events(conn, [_event(f"withdrawal.{outcome.value}", found)])
    return found, True


async def get(conn: AsyncConnection, withdrawal_id: str) -> Withdrawal | None:
    row = (await conn.execute(_select(withdrawals.c.id == withdrawal_id))).first()
    return None if row is None else _from_row(row)


async def of_user(
    conn: AsyncConnection,
    user_id: str,
    *,
    status: WithdrawalStatus | None = None,
    after: WithdrawalPosition | None = None,
    limit: int,
) -> WithdrawalsPage:
    """The user's withdrawals (of one `status`, or all), newest first, `limit` from after
    `after` (a page's `next_after`)."""
    query = _select(withdrawals.c.user_id == user_id)
    if status is not None:
        query = query.where(withdrawals.c.status == status.value)
    if after is not None:
        at = from_micros(after.at_us)
        created = withdrawals.c.created_at
        query = query.where(created <= at, sa.or_(created < at, withdrawals.c.id < after.id))
    query = query.order_by(withdrawals.c.created_at.desc(), withdrawals.c.id.desc())
    items, next_after = await _page(conn, query, limit)
    return WithdrawalsPage(user_id, items, next_after)


async def in_status(
    conn: AsyncConnection,
    status: WithdrawalStatus,
    *,
    requested_before: datetime | None = None,
    after: WithdrawalPosition | None = None,
    limit: int,
) -> StatusPage:
    """Every user's withdrawals in `status`, oldest first (by the time requested, then
    id), only those requested before `requested_before` if given, `limit` from after
    `after` (a page's `next_after`). An index range of `ix_withdrawals_status_time`."""
    created = withdrawals.c.created_at
    query = _select(withdrawals.c.status == status.value)
    if requested_before is not None:
        query = query.where(created < to_db(requested_before))
    if after is not None:
        at = from_micros(after.at_us)
        query = query.where(created >= at, sa.or_(created > at, withdrawals.c.id > after.id))
    query = query.order_by(created.asc(), withdrawals.c.id.asc())
    items, next_after = await _page(conn, query, limit)
    return StatusPage(status, items, next_after)


async def _page(
    conn: AsyncConnection, query: sa.Select[Any], limit: int
) -> tuple[list[Withdrawal], WithdrawalPosition | None]:
    """Up to `limit` withdrawals of an ordered `query`, and the position after the last
    one when more follow (None: this is the last page)."""
    rows = (await conn.execute(query.limit(limit + 1))).all()
    items = [_from_row(r) for r in rows[:limit]]
    if len(rows) <= limit:
        return items, None
    last = items[-1]
    return items, WithdrawalPosition(micros(to_db(last.created_at)), last.id)


async def oldest(conn: AsyncConnection, status: WithdrawalStatus) -> datetime | None:
    """When the oldest withdrawal in `status` was requested (None: there is none)."""
    found = await conn.scalar(
        sa.select(sa.func.min(withdrawals.c.created_at)).where(withdrawals.c.status == status.value)
    )
    return None if found is None else from_db(found)


async def totals(conn: AsyncConnection) -> dict[str, tuple[int, int]]:
    """Status -> how many withdrawals have it, and their fen (statuses without any left out)."""
    rows = await conn.execute(
        sa.select(
            withdrawals.c.status, sa.func.count(), sa.func.sum(withdrawals.c.amount)
        ).group_by(withdrawals.c.status)
    )
    return {status: (int(n), int(fen or 0)) for status, n, fen in rows}


# -- audit --------------------------------------------------------------------------------


async def audit_withdrawals(conn: AsyncConnection) -> tuple[list[str], int, int]:
    """Every withdrawal has its debit entry, a failed one its reversal and no other one
    has any, and no withdrawal or reversal entry is without its withdrawal. Returns the
    problems, the fen of the withdrawals in flight (requested) and the fen withdrawn
    (completed). A ledger before revision 0007 has no withdrawals. Its statements agree
    only when `conn` reads one snapshot (see `audit_ledger`)."""
    if not await conn.run_sync(lambda sync: sa.inspect(sync).has_table(withdrawals.name)):
        return [], 0, 0
    debit = entries.alias("debit")
    back = entries.alias("back")
    wid = withdrawals.c.id
    rows = await conn.execute(
        sa.select(
            wid,
            withdrawals.c.user_id,
            withdrawals.c.amount,
            withdrawals.c.status,
            debit.c.user_id,
            debit.c.kind,
            debit.c.amount,
            back.c.user_id,
            back.c.kind,
            back.c.amount,
        )
        .select_from(
            withdrawals.outerjoin(
                debit, debit.c.reference == _prefixed("withdrawal:", wid)
            ).outerjoin(back, back.c.reference == _prefixed("reversal:", wid))
        )
        .where(
            sa.or_(
                debit.c.id.is_(None),
                debit.c.user_id != withdrawals.c.user_id,
                debit.c.kind != "withdrawal",
                debit.c.amount != -withdrawals.c.amount,
                sa.and_(withdrawals.c.status != FAILED, back.c.id.is_not(None)),
                sa.and_(
                    withdrawals.c.status == FAILED,
                    sa.or_(
                        back.c.id.is_(None),
                        back.c.user_id != withdrawals.c.user_id,
                        back.c.kind != "reversal",
                        back.c.amount != withdrawals.c.amount,
                    ),
                ),
            )
        )
        .order_by(wid)
    )
    problems = [_explain(row) for row in rows]
    by_status = await totals(conn)
    by_kind = {
        kind: int(n)
        for kind, n in await conn.execute(
            sa.select(entries.c.kind, sa.func.count())
            .where(entries.c.kind.in_(("withdrawal", "reversal")))
            .group_by(entries.c.kind)
        )
    }
    made = sum(n for n, _ in by_status.values())
    failed = by_status.get(FAILED, (0, 0))[0]
    # each withdrawal matched its own entry above (references are unique): any more
    # entries of the kind belong to no withdrawal
    if by_kind.get("withdrawal", 0) != made:
        problems.append(
            f"withdrawals: {by_kind.get('withdrawal', 0)} withdrawal entries for {made} withdrawals"
        )
    if by_kind.get("reversal", 0) != failed:
        problems.append(
            f"withdrawals: {by_kind.get('reversal', 0)} reversal entries "
            f"for {failed} failed withdrawals"
        )
    in_flight = by_status.get(REQUESTED, (0, 0))[1]
    withdrawn = by_status.get(COMPLETED, (0, 0))[1]
    return problems, in_flight, withdrawn


def _explain(row: Any) -> str:
    """What is wrong with a withdrawal `audit_withdrawals` found (one of its rows)."""
    wid, user, amount, status, d_user, d_kind, d_amount, b_user, b_kind, b_amount = row
    where = f"withdrawal {wid} ({status}, {amount} fen of {user})"
    if d_user is None:
        return f"{where}: no debit entry {debit_reference(wid)}"
    if (d_user, d_kind, d_amount) != (user, "withdrawal", -amount):
        return f"{where}: debit entry is {d_kind} of {d_amount} fen for {d_user}"
    if status != FAILED:
        return f"{where}: has a reversal entry but did not fail"
    if b_user is None:
        return f"{where}: failed but no reversal entry {reversal_reference(wid)}"
    return f"{where}: reversal entry is {b_kind} of {b_amount} fen for {b_user}"


# -- rows ---------------------------------------------------------------------------------


def _select(condition: Any) -> sa.Select[Any]:
    return sa.select(*_COLUMNS).where(condition)


def _prefixed(prefix: str, column: Any) -> Any:
    """`prefix` + the column's text, as each database concatenates (MySQL: concat())."""
    return sa.literal(prefix, sa.String) + column


def _from_row(row: Any) -> Withdrawal:
    m = row._mapping
    return Withdrawal(
        id=m["id"],
        user_id=m["user_id"],
        amount=int(m["amount"]),
        status=WithdrawalStatus(m["status"]),
        created_at=from_db(m["created_at"]),
        updated_at=from_db(m["updated_at"]),
        note=m["outcome_note"],
        actor=m["actor"],
    )


def _event(event_type: str, w: Withdrawal) -> OutboxEvent:
    payload: dict[str, Any] = {
        "id": w.id,
        "user_id": w.user_id,
        "amount": w.amount,
        "status": w.status.value,
        "created_at": timestamp(w.created_at),
    }
    if w.status != WithdrawalStatus.REQUESTED:
        payload["note"] = w.note
    return OutboxEvent(event_type, withdrawal_subject(w.id), payload)
