"""Run `hongbao` the way a user does: the venv's console script, as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from hongbao.ledger import SqlLedger
from hongbao.serving.embedded import ledger_url

SCRIPT = Path(sys.executable).parent / "hongbao"


#: the clients drop an idle connection after 2 s, before uvicorn closes it (5 s): a
#: request sent on a connection the server is closing would fail with "Server
#: disconnected without sending a response"
CLIENT_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=2)


def command() -> list[str]:
    """The `hongbao` console script of this venv (or `python -m hongbao.cli` without one)."""
    return [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hongbao.cli"]


#: tests load one server from one address: the default rate limits would refuse them
NO_RATE_LIMITS = {"HONGBAO_RATE_LIMIT_USER": "0", "HONGBAO_RATE_LIMIT_IP": "0"}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without HONGBAO_* settings (the embedded default), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HONGBAO_")}
    env.update(extra)
    return env


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60, **kw: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [*command(), *args],
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kw,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def servers_for(data_dir: Path) -> list[str]:
    """valkey/redis server processes whose command line names this data dir."""
    out = subprocess.run(
        ["pgrep", "-af", "valkey-server|redis-server"], capture_output=True, text=True, check=False
    )
    return [line for line in out.stdout.splitlines() if str(data_dir) in line]


def audit(data_dir: Path) -> list[str]:
    """The ledger's invariant check on a stopped server's SQLite ledger."""

    async def run() -> list[str]:
        ledger = SqlLedger.from_url(ledger_url(data_dir))
        try:
            return await ledger.audit()
        finally:
            await ledger.aclose()

    return asyncio.run(run())


@contextlib.contextmanager
def separate_worker(redis_url: str | None, data_dir: Path, *args: str) -> Iterator[None]:
    """Run `hongbao worker` (persister + sweeper) beside a `serve --no-persister` (or
    without a Redis URL: on the embedded server of the serve running on `data_dir`);
    on exit SIGTERM it and check that it stopped cleanly."""
    where = ["--redis-url", redis_url] if redis_url else []
    worker = subprocess.Popen(
        [*command(), "worker", *where, "--data-dir", str(data_dir), *args],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        yield
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=30)[0].decode(errors="replace")
    assert worker.returncode == 0, output
    assert "Traceback" not in output, output


class Serve:
    """`hongbao serve --data-dir DIR --port PORT` as a subprocess."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *args: str,
        launcher: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.args = args
        #: the command's environment: no HONGBAO_* variable but the rate limits off (the
        #: tests load one server from one address), then `env` over it
        self.env = {**clean_env(**NO_RATE_LIMITS), **(env or {})}
        #: what runs the CLI (default: the `hongbao` command)
        self.launcher = launcher
        self.log_path = data_dir.parent / f"serve-{data_dir.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Self:
        argv = [
            *(self.launcher or command()),
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            *self.args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"hongbao serve exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"hongbao serve did not answer within {timeout}s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal the server and wait; its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"hongbao serve ignored signal {sig}:\n{self.log()}") from None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return "(no log)"

    def tokens(self, *users: str, admin: bool = False) -> list[str]:
        flags = ["--admin"] if admin else []
        done = run_cli("token", *users, *flags, "--data-dir", str(self.data_dir), env=self.env)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(AssertionError):
                self.stop()


def worker_pids(server: Serve) -> list[int]:
    """The API worker processes of `serve --workers N` (spawned children of the command)."""
    assert server.proc is not None
    pids: list[int] = []
    for task in Path(f"/proc/{server.proc.pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
    return sorted(pids)


def connections_by_pid(port: int, pids: list[int], state: str = "01") -> dict[int, int]:
    """How many TCP sockets on local `port` in `state` (01: established, 0A: listening)
    each of `pids` holds (Linux)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                    inodes.add(fields[9])
    held: dict[int, int] = {}
    for pid in pids:
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        held[pid] = sum(1 for link in links if link.startswith("socket:[") and link[8:-1] in inodes)
    return held
