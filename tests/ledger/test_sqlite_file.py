"""The SQLite ledger file and its WAL companions are private to their owner."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hongbao.ledger import SqlLedger


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that lets group and others read new files, as many systems have."""
    before = os.umask(0o022)
    yield
    os.umask(before)


async def test_new_ledger_file_is_owner_only(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = SqlLedger.from_url(f"sqlite:///{path}")
    try:
        await ledger.migrate()
        assert await ledger.deposit("alice", 100, "r") == 100
        async with ledger.engine.connect() as conn:  # an open connection keeps -wal and -shm
            await conn.exec_driver_sql("SELECT 1")
            companions = [tmp_path / f"ledger.sqlite3{suffix}" for suffix in ("-wal", "-shm")]
            assert all(p.exists() for p in companions)
            assert [mode(p) for p in [path, *companions]] == [0o600, 0o600, 0o600]
    finally:
        await ledger.aclose()


async def test_existing_ledger_file_keeps_its_mode(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "ledger.sqlite3"
    path.touch(mode=0o640)
    ledger = SqlLedger.from_url(f"sqlite:///{path}")
    try:
        await ledger.migrate()
        assert mode(path) == 0o640
    finally:
        await ledger.aclose()


def test_missing_folder_is_left_to_sqlite(tmp_path: Path) -> None:
    SqlLedger.from_url(f"sqlite:///{tmp_path / 'absent' / 'ledger.sqlite3'}")
    assert not (tmp_path / "absent").exists()
