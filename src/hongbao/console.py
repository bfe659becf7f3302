"""What every command-line entry point shares: the error console, one-line failures,
friendly errors instead of tracebacks, logging, and running a coroutine on uvloop.

Exit codes: 0 done, 1 a server or database failed, 2 bad input or configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterator
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from hongbao.errors import ConfigurationError, HongbaoError, InvalidRequest

T = TypeVar("T")

err = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with `code`. The message is plain text,
    shown as it is: what a user typed (``[/x]``) is never read as Rich markup."""
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def friendly_errors() -> Iterator[None]:
    """hongbao's errors as one line and an exit code, not a traceback."""
    try:
        yield
    except (ConfigurationError, InvalidRequest) as exc:
        fail(str(exc), 2)
    except HongbaoError as exc:
        fail(str(exc), 1)
    except OSError as exc:
        fail(str(exc), 1)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=err, show_path=False, rich_tracebacks=False)],
        force=True,
    )
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))
