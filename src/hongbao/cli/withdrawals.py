"""`hongbao withdrawals`: the operator's view of the money in flight.

- ``pending [--older-than 1h]``: the withdrawals still requested, oldest first: each
  debited its wallet, and the host's payment system has not reported its payout
  completed or failed. Exit 1 while any is listed, so a cron job alerts on them; ask
  the payment system what became of each, then report it with ``POST
  /v1/withdrawals/{id}/complete`` or ``/fail`` (which gives the money back).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from hongbao.cli.ledger_work import on_ledger
from hongbao.cli.options import DEFAULT_DATA_DIR, DatabaseUrl, DataDir, age_between

if TYPE_CHECKING:
    from pathlib import Path

    from hongbao.domain.withdrawals import Withdrawal
    from hongbao.withdrawals import Withdrawals

T = TypeVar("T")

app = typer.Typer(
    name="withdrawals",
    help="Withdrawals: pending (those whose payout the payment system never reported).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: what `pending --older-than` takes (the API's `older_than` goes as far)
MAX_PENDING_AGE = timedelta(days=3650)
#: withdrawals read per query while listing
_PAGE = 200


def parse_pending_age(value: str) -> timedelta:
    """An age like ``30m``, ``12h`` or ``2d``, from 0 minutes to 3650 days."""
    return age_between(value, timedelta(0), MAX_PENDING_AGE)


def format_age(age: timedelta) -> str:
    """An age in its two largest units, a zero second one left out: ``2d 3h``, ``12h``,
    ``4h 5m``, ``6m 7s``, ``8s``."""
    seconds = max(int(age.total_seconds()), 0)
    days, seconds = divmod(seconds, 86_400)
    hours, seconds = divmod(seconds, 3_600)
    minutes, seconds = divmod(seconds, 60)
    units = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    for (n, unit), (smaller, smaller_unit) in pairwise(units):
        if n:
            return f"{n}{unit} {smaller}{smaller_unit}" if smaller else f"{n}{unit}"
    return f"{seconds}s"


def pending_line(w: Withdrawal, now: datetime) -> str:
    """One withdrawal of `pending`: id, user, amount, when requested (UTC), and age."""
    requested = w.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        f"{w.id}  {w.user_id}  {w.amount} fen  requested {requested}  "
        f"age {format_age(now - w.created_at)}"
    )


def _run(
    database_url: str | None, data_dir: Path, work: Callable[[Withdrawals], Awaitable[T]]
) -> T:
    from hongbao.withdrawals import Withdrawals

    return on_ledger(database_url, data_dir, lambda ledger: work(Withdrawals(ledger)))


@app.command("pending")
def pending(
    older_than: Annotated[
        timedelta | None,
        typer.Option(
            "--older-than",
            help="Only those requested longer ago than this: 30m, 12h or 2d (default: all).",
            parser=parse_pending_age,
            metavar="AGE",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Show at most this many.")] = 100,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Withdrawals whose payout is not reported yet, oldest first; exit 1 while any is.

    Each debited its wallet, and the payment system has not reported it completed or
    failed. Exit 1 while any is listed, 0 when none is (for an alert from cron)."""
    seconds = None if older_than is None else int(older_than.total_seconds())

    async def work(withdrawals: Withdrawals) -> tuple[list[Withdrawal], bool]:
        """The oldest `limit` of them, and whether there are more."""
        found: list[Withdrawal] = []
        page = await withdrawals.in_status(older_than=seconds, limit=min(limit, _PAGE))
        found.extend(page.items)
        while page.next_after is not None and len(found) < limit:
            page = await withdrawals.in_status(
                older_than=seconds, after=page.next_after, limit=min(limit - len(found), _PAGE)
            )
            found.extend(page.items)
        return found, page.next_after is not None

    found, more = _run(database_url, data_dir, work)
    now = datetime.now(UTC)
    for w in found:
        typer.echo(pending_line(w, now))
    typer.echo(pending_summary(found, more, older_than))
    raise typer.Exit(1 if found else 0)


def pending_summary(found: list[Withdrawal], more: bool, older_than: timedelta | None) -> str:
    """The last line of `pending`: how many are waiting and their fen, and what to do."""
    since = "" if older_than is None else f" requested more than {format_age(older_than)} ago"
    if not found:
        return f"no withdrawal{since} awaits its outcome"
    n, fen = len(found), sum(w.amount for w in found)
    if more:
        waiting = (
            f"more than {n} withdrawals{since} await their outcome "
            f"({fen} fen in the {n} listed; a higher --limit lists more)"
        )
    elif n == 1:
        waiting = f"1 withdrawal{since} awaits its outcome ({fen} fen)"
    else:
        waiting = f"{n} withdrawals{since} await their outcome ({fen} fen)"
    return f"{waiting}: ask the payment system what became of each, then complete or fail it"
