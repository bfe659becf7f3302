"""Options several commands share, and how a URL is shown without its password."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DEFAULT_DATA_DIR = Path("hongbao-data")

DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="HONGBAO_DATA_DIR",
        help="Folder for the embedded server's data, the SQLite ledger and the secret.",
        file_okay=False,
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="HONGBAO_REDIS_URL",
        help="redis://, rediss://, redis+sentinel://, redis+cluster:// (default: embedded).",
        show_default=False,
    ),
]
DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="HONGBAO_DATABASE_URL",
        help="PostgreSQL, MySQL/MariaDB or SQLite URL (default: SQLite in the data dir).",
        show_default=False,
    ),
]
LogLevel = Annotated[str, typer.Option(help="debug, info, warning or error.")]


def safe_url(url: str) -> str:
    """A URL without its password (a URL with none is shown as it is)."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, cred = head.partition("://")
    user, has_password, _ = cred.partition(":")
    return f"{scheme}://{user}{':***' if has_password else ''}@{tail}"
