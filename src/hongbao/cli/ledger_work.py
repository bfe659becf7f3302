"""One piece of work on the ledger from a command: on the URL given, or on the embedded
default's SQLite file under --data-dir; errors shown as one line, the ledger closed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from hongbao.console import fail, friendly_errors, run_async

if TYPE_CHECKING:
    from pathlib import Path

    from hongbao.ledger import SqlLedger

T = TypeVar("T")


def existing_ledger_url(database_url: str | None, data_dir: Path) -> str:
    """The ledger to work on: `database_url`, or the data folder's SQLite file if it
    exists; else exit 2 (opening a missing SQLite file would create an empty ledger)."""
    if database_url:
        return database_url
    from hongbao.serving.embedded import LEDGER_FILE, ledger_url

    if not (data_dir / LEDGER_FILE).is_file():
        fail(f"{data_dir} holds no ledger ({LEDGER_FILE}); give --database-url or --data-dir")
    return ledger_url(data_dir)


def on_ledger(
    database_url: str | None, data_dir: Path, work: Callable[[SqlLedger], Awaitable[T]]
) -> T:
    """Run `work` on the ledger and return what it returns."""
    from hongbao.ledger import SqlLedger

    url = existing_ledger_url(database_url, data_dir)

    async def run() -> T:
        ledger = SqlLedger.from_url(url)
        try:
            return await work(ledger)
        finally:
            await ledger.aclose()

    with friendly_errors():
        return run_async(run())
    raise AssertionError("unreachable")
