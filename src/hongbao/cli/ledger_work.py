"""One piece of work on the ledger from a command: on the URL given, or on the embedded
default's SQLite file under --data-dir; errors shown as one line, the ledger closed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from hongbao.console import friendly_errors, run_async

if TYPE_CHECKING:
    from pathlib import Path

    from hongbao.ledger import SqlLedger

T = TypeVar("T")


def on_ledger(
    database_url: str | None, data_dir: Path, work: Callable[[SqlLedger], Awaitable[T]]
) -> T:
    """Run `work` on the ledger and return what it returns."""
    from hongbao.ledger import SqlLedger
    from hongbao.serving.embedded import ledger_url

    async def run() -> T:
        ledger = SqlLedger.from_url(database_url or ledger_url(data_dir))
        try:
            return await work(ledger)
        finally:
            await ledger.aclose()

    with friendly_errors():
        return run_async(run())
    raise AssertionError("unreachable")
