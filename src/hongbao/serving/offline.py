"""Operator commands (`audit`, `recover`, `dead-letters`) on the servers `serve` would use.

On the embedded default they run against the server a live `hongbao serve` runs on the
data folder, or, when none runs, against one started just for the command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from hongbao.errors import ConfigurationError, HongbaoError, StorageError
from hongbao.serving.embedded import EmbeddedServer, embedded_settings, ledger_url
from hongbao.settings import Settings


def operator_settings(
    data_dir: Path, redis_url: str | None, database_url: str | None
) -> tuple[Settings, EmbeddedServer | None]:
    """Settings like `serve`'s; in embedded mode, the running server if there is one, else
    a server started for the caller (who must stop it)."""
    if redis_url:
        return Settings.from_env(
            redis_url=redis_url, database_url=database_url or ledger_url(data_dir)
        ), None
    data_dir = Path(data_dir).resolve()
    running = EmbeddedServer(data_dir).url_if_running()
    if running is not None:
        return Settings.from_env(
            redis_url=running, database_url=database_url or ledger_url(data_dir)
        ), None
    if not (data_dir / "redis").is_dir():
        raise ConfigurationError(f"{data_dir} holds no hongbao data (no redis/ folder)")
    return embedded_settings(data_dir, database_url=database_url)


def run_offline(
    data_dir: Path,
    redis_url: str | None,
    database_url: str | None,
    body: Callable[[Settings], Coroutine[Any, Any, int]],
) -> int:
    """Run an operator command's `body` on the settings `serve` would use; its exit code."""
    settings, server = operator_settings(data_dir, redis_url, database_url)
    try:
        return asyncio.run(body(settings))
    except HongbaoError:
        raise
    except (RedisError, OSError) as exc:
        raise StorageError(str(exc)) from exc
    finally:
        if server is not None:
            server.stop()
