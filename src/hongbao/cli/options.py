"""Options several commands share, and how a URL is shown without its password."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_DATA_DIR = Path("hongbao-data")
#: what an age option takes: a whole number of days, hours or minutes
AGE_MINUTES = {"d": 24 * 60, "h": 60, "m": 1}


def age_between(value: str, least: timedelta, most: timedelta) -> timedelta:
    """An age like ``30d``, ``12h`` or ``90m``, from `least` to `most`;
    typer.BadParameter (a usage error, exit 2) saying what it takes otherwise."""
    match = re.fullmatch(r"([0-9]{1,18})([dhm])", value.strip())
    if match is None:
        raise typer.BadParameter(f"{value!r} is not an age like 30d, 12h or 90m")
    minutes = int(match[1]) * AGE_MINUTES[match[2]]
    if not least.total_seconds() <= minutes * 60 <= most.total_seconds():
        raise typer.BadParameter(f"{value!r} is not from {_shown(least)} to {_shown(most)}")
    return timedelta(minutes=minutes)


def _shown(age: timedelta) -> str:
    """An age as `age_between` takes it, in its largest whole unit."""
    minutes = int(age.total_seconds()) // 60
    for unit, size in AGE_MINUTES.items():
        if minutes % size == 0 and (minutes or unit == "m"):
            return f"{minutes // size}{unit}"
    raise AssertionError("unreachable: every age is a whole number of minutes")


def data_dir_path(value: str | Path) -> Path:
    """A --data-dir: not empty (that would be the working directory, unsaid), and not a
    file; it need not exist yet."""
    if isinstance(value, Path):
        return value  # the default
    if not value.strip():
        raise typer.BadParameter("must not be empty")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise typer.BadParameter(f"{value} exists and is not a directory")
    return path


DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="HONGBAO_DATA_DIR",
        help="Folder for the embedded server's data, the SQLite ledger and the secret.",
        parser=data_dir_path,
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="HONGBAO_REDIS_URL",
        help="redis://, rediss://, unix://, redis+sentinel://, redis+cluster:// "
        "(default: embedded).",
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
AllowEviction = Annotated[
    bool,
    typer.Option(
        "--allow-eviction",
        envvar="HONGBAO_ALLOW_EVICTION",
        help="Run on a Redis whose maxmemory-policy may evict keys (it may drop packets), "
        "with a warning, instead of refusing to start.",
    ),
]


def safe_url(url: str) -> str:
    """A URL without its password (a URL with none is shown as it is)."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, cred = head.partition("://")
    user, has_password, _ = cred.partition(":")
    return f"{scheme}://{user}{':***' if has_password else ''}@{tail}"
