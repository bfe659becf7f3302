"""`serve`'s supervisor of the embedded server: a dead server comes back, with its data,
repaired before anything else reaches it; one that cannot come back stops `serve`."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from hongbao.errors import StorageError
from hongbao.serving import supervisor as supervision
from hongbao.serving.embedded import EmbeddedServer, server_binary
from hongbao.serving.supervisor import Supervisor


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "BACKOFF", (0.0, 0.05))


def wait_for(condition: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class GiveUp:
    def __init__(self) -> None:
        self.called = threading.Event()

    def __call__(self) -> None:
        self.called.set()


@pytest.fixture
def flaky_binary(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A server binary that refuses to start while the flag file exists."""
    flag = tmp_path / "refuse"
    script = tmp_path / "flaky-server"
    script.write_text(
        f'#!/bin/sh\nif [ -e "{flag}" ]; then echo "FATAL: refusing" >&2; exit 3; fi\n'
        f'exec "{server_binary()}" "$@"\n'
    )
    script.chmod(0o755)
    yield script, flag


def test_a_killed_server_comes_back_with_its_data_repaired_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = EmbeddedServer(tmp_path / "data")
    url = server.start()
    seen: list[tuple[str, bool]] = []

    def prepare(private_url: str) -> None:
        with redis.Redis.from_url(private_url) as c:
            c.set("repaired", "yes")  # what recover does: before anyone else can see
        try:
            redis.Redis(unix_socket_path=str(server.socket_path)).ping()
            public = True
        except redis.ConnectionError:
            public = False
        seen.append((private_url, public))

    gave_up = GiveUp()
    watch = Supervisor(server, gave_up, prepare)
    watch.start()
    try:
        with redis.Redis.from_url(url) as c:
            c.set("kept", "1")
            c.execute_command("WAITAOF", 1, 0, 2000)  # on disk: survives a SIGKILL
        old = server.pid
        assert old is not None
        with caplog.at_level(logging.WARNING, "hongbao.embedded"):
            os.kill(old, signal.SIGKILL)
            wait_for(lambda: watch.restarts == 1)
        assert server.pid != old and not gave_up.called.is_set()
        assert seen == [(f"unix://{server.redis_dir}/recover.sock?db=0", False)]
        assert server.url == url
        with redis.Redis.from_url(url) as c:
            assert c.get("kept") == b"1" and c.get("repaired") == b"yes"
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "exited (status -9); restarting" in messages and "is back" in messages
    finally:
        watch.stop()
    assert not server.running


def test_a_server_that_cannot_come_back_stops_serve(
    tmp_path: Path, flaky_binary: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    binary, flag = flaky_binary
    server = EmbeddedServer(tmp_path / "data", binary=binary, start_timeout=5)
    server.start()
    gave_up = GiveUp()
    watch = Supervisor(server, gave_up)
    watch.start()
    try:
        flag.touch()
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert gave_up.called.wait(30)
        assert watch.gave_up and watch.restarts == 0
        failures = [r for r in caplog.records if "failed: embedded Redis server" in r.getMessage()]
        assert len(failures) == supervision.MAX_FAILURES
        assert "refusing" in failures[-1].getMessage()  # the server's own words
    finally:
        watch.stop()
    assert not server.running


def test_a_failed_repair_counts_as_a_failed_restart(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "data")
    server.start()
    attempts: list[str] = []

    def prepare(url: str) -> None:
        attempts.append(url)
        if len(attempts) < 3:
            raise StorageError("the ledger is not reachable")

    watch = Supervisor(server, GiveUp(), prepare)
    watch.start()
    try:
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: watch.restarts == 1)
        assert len(attempts) == 3 and server.running
    finally:
        watch.stop()


def test_a_restart_that_raises_an_os_error_counts_as_failed_and_stops_serve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart step that fails with a plain OSError (here the config file cannot be
    written: a folder took its name; ENOMEM on fork or a full disk alike) is a failed
    restart like any other: retried, then serve is told to stop."""
    server = EmbeddedServer(tmp_path / "data")
    server.start()
    gave_up = GiveUp()
    watch = Supervisor(server, gave_up)
    watch.start()
    try:
        server.config_path.unlink()
        server.config_path.mkdir()
        pid = server.pid
        assert pid is not None
        with caplog.at_level(logging.ERROR, "hongbao.embedded"):
            os.kill(pid, signal.SIGKILL)
            assert gave_up.called.wait(30)
        assert watch.gave_up and watch.restarts == 0
        failures = [r for r in caplog.records if r.getMessage().startswith("restart ")]
        assert len(failures) == supervision.MAX_FAILURES
        assert all(r.exc_info is not None for r in failures)  # logged with the traceback
        assert "IsADirectoryError" in caplog.text
    finally:
        watch.stop()
    assert not server.running


def test_a_restart_that_raises_once_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = EmbeddedServer(tmp_path / "data")
    server.start()
    launch = server._launch
    calls: list[Path] = []

    def out_of_memory_once(binary: Path, socket_path: Path) -> None:
        calls.append(socket_path)
        if len(calls) == 1:
            raise OSError(12, "Cannot allocate memory")
        launch(binary, socket_path)

    monkeypatch.setattr(server, "_launch", out_of_memory_once)
    gave_up = GiveUp()
    watch = Supervisor(server, gave_up)
    watch.start()
    try:
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: watch.restarts == 1)
        assert len(calls) == 2 and server.running and not gave_up.called.is_set()
    finally:
        watch.stop()
    assert not server.running


def test_a_server_stopped_together_with_serve_is_not_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """systemd's KillMode=control-group sends SIGTERM to serve and its server at once:
    the server may exit before serve's handler says that serve stops."""
    server = EmbeddedServer(tmp_path / "data")
    server.start()
    gave_up = GiveUp()
    watch = Supervisor(server, gave_up)
    watch.start()
    try:
        pid = server.pid
        assert pid is not None
        with caplog.at_level(logging.INFO, "hongbao.embedded"):
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: not server.running)
            time.sleep(0.3)  # serve's own SIGTERM handler runs a moment later
            watch.shutting_down()
            time.sleep(supervision.STOP_GRACE + 0.5)
        assert watch.restarts == 0 and not server.running and not gave_up.called.is_set()
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "restarting it" not in messages and "leaving it stopped" in messages
    finally:
        watch.stop()


def test_a_server_that_exits_cleanly_on_its_own_is_restarted(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "data")
    server.start()
    watch = Supervisor(server, GiveUp())
    watch.start()
    try:
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)  # nobody stops serve: the server comes back
        wait_for(lambda: watch.restarts == 1)
        assert server.running and server.pid != pid
    finally:
        watch.stop()
