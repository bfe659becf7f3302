"""`hongbao statement`: every ledger entry of a UTC day, to match against other books (对账).

The output (CSV by default, or the JSON of ``GET /v1/admin/statements/{date}``) lists one
line per entry, then the totals per kind, then the wallets' balances at the start and the
end of the day and whether start + entries = end. Start and end are derived from other
data than the day's entries (see `hongbao.domain.history.Statement`), so an entry changed
after the fact shows. Exit 0 when the day adds up, 1 when it does not (saying where).
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import stat
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hongbao.cli.ledger_work import existing_ledger_url
from hongbao.cli.options import DEFAULT_DATA_DIR, DatabaseUrl, DataDir
from hongbao.console import err, fail, friendly_errors, run_async

if TYPE_CHECKING:
    from hongbao.domain.history import Statement

FORMATS = ("csv", "json")
#: wallets that do not add up, named on stderr (all of them are in the output)
SHOWN_WALLETS = 20


def statement(
    day: Annotated[
        str | None,
        typer.Option(
            "--date",
            metavar="YYYY-MM-DD",
            help="The UTC day (default: yesterday, the last whole day).",
            show_default=False,
        ),
    ] = None,
    output_format: Annotated[
        str, typer.Option("--format", metavar="csv|json", help="csv or json.")
    ] = "csv",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write to this file, mode 0600 (default: stdout).", dir_okay=False
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Every ledger entry of a UTC day, per-kind totals and the balance check; exit 1 if
    the wallets at the day's start plus its entries do not make those at its end."""
    from hongbao.api.history import parse_day, statement_json

    if output_format not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}, not {output_format!r}")
    with friendly_errors():
        wanted = parse_day(day) if day is not None else datetime.now(UTC).date() - timedelta(days=1)
        st = run_async(_read(wanted, existing_ledger_url(database_url, data_dir)))
    text = (
        json.dumps(statement_json(st), ensure_ascii=False, indent=1) + "\n"
        if output_format == "json"
        else statement_csv(st)
    )
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        _write_private(out, text)
    _say_check(st)
    raise typer.Exit(0 if st.balanced else 1)


def statement_csv(st: Statement) -> str:
    """The entries, a blank line, the totals per kind, a blank line, the check."""
    buffer = io.StringIO()
    rows = csv.writer(buffer, lineterminator="\n")
    rows.writerow(["reference", "wallet", "kind", "amount", "packet", "time"])
    for line in st.lines:
        moment = line.created_at.astimezone(UTC).isoformat(timespec="microseconds")
        rows.writerow(
            [
                line.reference,
                line.user_id,
                line.kind,
                line.amount,
                line.packet_id or "",
                moment.replace("+00:00", "Z"),
            ]
        )
    rows.writerow([])
    rows.writerow(["kind", "count", "amount"])
    for total in st.by_kind:
        rows.writerow([total.kind, total.count, total.amount])
    rows.writerow([])
    rows.writerow(["date", "start_balance", "entries_total", "end_balance", "difference", "check"])
    check = "balanced" if st.balanced else "NOT BALANCED"
    rows.writerow([st.day.isoformat(), st.start, st.entries, st.end, st.difference, check])
    if st.wallets_off:
        rows.writerow([])
        rows.writerow(["wallet", "start", "entries", "end"])
        for w in st.wallets_off:
            rows.writerow([w.user_id, w.start, w.entries, w.end])
    return buffer.getvalue()


async def _read(day: date, url: str) -> Statement:
    from hongbao.history import History
    from hongbao.ledger import SqlLedger

    ledger = SqlLedger.from_url(url)
    try:
        return await History(ledger).statement(day)
    finally:
        await ledger.aclose()


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by its owner only (every wallet is in it) whatever
    mode a file there had. A symbolic link or anything but a regular file is refused
    (exit 2), as is a file that cannot be made private; nothing is written then."""
    try:
        # no following a link; a FIFO with no reader fails here instead of blocking
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            fail(f"--out {path} is a symbolic link: give the file itself")
        fail(f"--out {path}: {exc.strerror or exc}")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                fail(f"--out {path} is not a regular file")
            os.fchmod(fd, 0o600)  # before the old content goes: never readable by others
        except OSError as exc:
            fail(f"--out {path}: {exc.strerror or exc}")
        with friendly_errors():
            os.ftruncate(fd, 0)
            f.write(text)
            f.flush()


def _say_check(st: Statement) -> None:
    head = (
        f"statement {st.day.isoformat()}: {len(st.lines)} entries; "
        f"start {st.start} + entries {st.entries} = {st.start + st.entries}, end {st.end}"
    )
    if st.balanced:
        err.print(f"{head}: balanced", style="green")
        return
    err.print(f"[bold red]NOT BALANCED:[/] {head} (difference {st.difference})", markup=True)
    for w in st.wallets_off[:SHOWN_WALLETS]:
        err.print(
            f"  wallet {w.user_id}: start {w.start} + entries {w.entries} != end {w.end}",
            markup=False,
        )
    if len(st.wallets_off) > SHOWN_WALLETS:
        err.print(f"  … and {len(st.wallets_off) - SHOWN_WALLETS} more wallets", markup=False)
