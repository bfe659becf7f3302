"""`hongbao serve --workers N`: N uvicorn processes, each accepting on a socket of its own.

uvicorn's own supervisor binds one socket that all its workers accept from. When many
connections arrive together, whichever worker wakes first accepts most of them: wrk's
64 connections split 54/10, 56/8 and 42/22 between two workers here. A worker with few
connections then idles while their grabs wait on Redis, and the one with most is the
limit. With SO_REUSEPORT each worker listens on a socket of its own on the same port,
and the kernel spreads new connections across the sockets by their addresses.

The supervisor here restarts a worker that dies, stops them all when one of the first
start cannot start (exit 2 for bad settings, 1 otherwise), starts again with backoff a
replacement that cannot start, gives up (exit 1) only when no worker runs and
`MAX_RESTART_FAILURES` replacements in a row could not start, and on SIGINT or SIGTERM
stops them all (each finishes its requests, as uvicorn's workers do). Should the
supervisor itself be killed outright (SIGKILL, the OOM killer), Linux sends each worker
SIGTERM (PR_SET_PDEATHSIG), so no worker is left serving on the port with nobody to stop
or restart it. Without SO_REUSEPORT (not Linux) uvicorn's supervisor runs instead.
"""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any, cast

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from hongbao.errors import ConfigurationError, InvalidRequest
from hongbao.serving.embedded import parent_death_signal, process_alive
from hongbao.serving.grab_protocol import GrabProtocol

log = logging.getLogger("hongbao.workers")

#: a worker that fails this soon after it started did not start: at the first start serve
#: stops, a replacement is started again after a backoff; one killed by a signal is
#: replaced at once, whenever it dies
MIN_UPTIME = 5.0
#: waits before the n-th start in a row of a replacement that could not start, seconds
#: (the last one repeats)
RESTART_BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
#: replacements in a row that could not start, with no worker left running, before the
#: supervisor gives up
MAX_RESTART_FAILURES = 5
#: a worker's exit code when its settings are bad (serve then exits 2 too)
BAD_SETTINGS = 2
#: seconds a stopping worker gives its open requests
SHUTDOWN_TIMEOUT = 10


def uvicorn_options(
    host: str,
    port: int,
    log_level: str,
    access_log: bool,
    trusted_proxies: list[str],
) -> dict[str, Any]:
    """The uvicorn settings `hongbao serve` runs with (the bench's hello-world too).

    X-Forwarded-For and X-Forwarded-Proto are believed only from `trusted_proxies`
    (addresses or CIDRs); with none, the socket peer is the client, whatever it sends.
    Plain grabs are answered from the HTTP parser (`GrabProtocol`)."""
    return {
        "host": host,
        "port": port,
        "log_level": log_level,
        "access_log": access_log,
        "lifespan": "on",
        "timeout_graceful_shutdown": SHUTDOWN_TIMEOUT,
        "server_header": False,
        "http": GrabProtocol,
        "proxy_headers": bool(trusted_proxies),
        "forwarded_allow_ips": ",".join(trusted_proxies) or None,
    }


def workers_folder(data_dir: Path) -> Path:
    """The folder one `serve --workers N` run's workers share: <data dir>/metrics/<pid>.

    A run removes its folder when it stops; one that crashed (SIGKILL, power loss)
    cannot, so each start first removes the folders of runs whose process is gone.
    Runs sharing a data dir keep their own. Without a data dir (Redis, the database
    and the secret all configured) or with one that cannot hold the folder (read-only),
    the folder is a temporary one."""
    if not data_dir.is_dir():
        return Path(tempfile.mkdtemp(prefix="hongbao-metrics-"))
    root = data_dir / "metrics"
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for folder in root.iterdir():
            if folder.name.isdigit() and not process_alive(int(folder.name)):
                shutil.rmtree(folder, ignore_errors=True)
        mine = root / str(os.getpid())
        shutil.rmtree(mine, ignore_errors=True)  # a crashed run that had this pid
        mine.mkdir(mode=0o700)
    except OSError as exc:
        log.warning("no metrics folder under %s (%s); using a temporary one", data_dir, exc)
        return Path(tempfile.mkdtemp(prefix="hongbao-metrics-"))
    return mine


def reuse_port_available() -> bool:
    """SO_REUSEPORT spreads connections across sockets on Linux (elsewhere it may not)."""
    return sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")


class Server(uvicorn.Server):
    """uvicorn's server, calling `on_signal` first when SIGTERM or SIGINT asks it to stop
    (serve's embedded server is then not restarted should it exit meanwhile)."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._on_signal is not None:
            self._on_signal()
        super().handle_exit(sig, frame)


def serve_workers(
    app: str,
    workers: int,
    options: dict[str, Any],
    nice: int = 0,
    on_signal: Callable[[], None] | None = None,
) -> int:
    """Run `app` (an import string) in `workers` processes until SIGINT or SIGTERM;
    uvicorn `options` as for `uvicorn.run`; each worker `nice` steps below this process's
    scheduling priority; `on_signal` is called first on SIGINT or SIGTERM. Returns an
    exit code: 0 after a requested stop, 2 when a worker of the first start found the
    settings bad, 1 when one could not start otherwise or no worker can be kept
    running. ConfigurationError if the port is taken."""
    if not reuse_port_available():
        uvicorn.run(app, workers=workers, **options)
        return 0
    check_port_free(options["host"], options["port"])
    context = multiprocessing.get_context("spawn")
    stopping: list[int] = []

    def stop(sig: int, frame: FrameType | None) -> None:
        if on_signal is not None:
            on_signal()
        stopping.append(sig)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    #: sentinel -> (process, when started, whether of the first start)
    running: dict[int, tuple[BaseProcess, float, bool]] = {}
    #: when each replacement that is waiting after a failed start is due
    due: list[float] = []
    #: replacements in a row that could not start
    failures = 0

    def start(first: bool) -> None:
        process = context.Process(
            target=_worker, args=(app, options, os.getpid(), nice), daemon=False
        )
        process.start()
        running[process.sentinel] = (process, time.monotonic(), first)

    code = 0
    try:
        for _ in range(workers):
            start(first=True)
        while not stopping:
            now = time.monotonic()
            for at in [at for at in due if at <= now]:
                due.remove(at)
                start(first=False)
            if failures and any(
                not first and now - started >= MIN_UPTIME for _, started, first in running.values()
            ):
                failures = 0  # a replacement held
            timeout = max(0.0, min([0.5, *(at - now for at in due)]))
            if not running:
                time.sleep(timeout)
                continue
            for sentinel in wait(list(running), timeout=timeout):
                process, started, first = running.pop(cast(int, sentinel))
                process.join()
                if stopping:
                    break
                exited = process.exitcode or 0
                early = time.monotonic() - started < MIN_UPTIME
                if not (exited == STARTUP_FAILURE or (exited > 0 and early)):
                    log.warning("worker %s exited (%s); starting another", process.pid, exited)
                    start(first=False)
                    continue
                if first:
                    log.error("worker %s could not start (exit %s)", process.pid, exited)
                    code = 2 if exited == BAD_SETTINGS else 1
                    stopping.append(0)
                    break
                failures += 1
                if failures >= MAX_RESTART_FAILURES and not running:
                    log.critical(
                        "worker %s could not start (exit %s): %d replacements in a row "
                        "could not start and no worker runs; stopping",
                        process.pid,
                        exited,
                        failures,
                    )
                    code = 1
                    stopping.append(0)
                    break
                delay = RESTART_BACKOFF[min(failures, len(RESTART_BACKOFF)) - 1]
                log.error(
                    "worker %s could not start (exit %s); starting another in %gs",
                    process.pid,
                    exited,
                    delay,
                )
                due.append(time.monotonic() + delay)
    finally:
        for process, _, _ in running.values():
            if process.exitcode is None:
                process.terminate()  # SIGTERM: uvicorn's graceful shutdown
        for process, _, _ in running.values():
            process.join()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code


def bind_listener(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A socket bound to host:port (uvicorn listens on it), as uvicorn binds one: the
    family by the host's form, SO_REUSEADDR. ConfigurationError, one line, when the host
    does not resolve or the port cannot be had. Without `reuse_port` a second server
    cannot share the port of a first."""
    family = _family(host)
    try:
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
    except (socket.gaierror, UnicodeError):
        raise ConfigurationError(f"cannot resolve host {host}") from None
    sock = socket.socket(family)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {_why(exc, port)}") from None
    sock.set_inheritable(True)
    return sock


def _why(exc: OSError, port: int) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is in use"
    if exc.errno == errno.EACCES:
        return f"port {port} needs privileges this process lacks"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "no network interface of this machine has that address"
    return exc.strerror or str(exc)


def check_port_free(host: str, port: int) -> None:
    """ConfigurationError when host:port cannot be listened on (see `bind_listener`)."""
    bind_listener(host, port).close()


def _worker(app: str, options: dict[str, Any], supervisor: int, nice: int) -> None:
    """One worker process: its own listening socket, then uvicorn's server on it. Exits
    `BAD_SETTINGS` when the app refuses its settings, STARTUP_FAILURE when it cannot
    start otherwise."""
    try:
        _stop_with(supervisor)
        if nice:
            os.nice(nice)
        config = uvicorn.Config(app, **options)  # sets up uvicorn's logging too
        try:
            config.load()  # the app, built from the settings
        except (ConfigurationError, InvalidRequest) as exc:
            log.error("worker %s: %s", os.getpid(), exc)
            sys.exit(BAD_SETTINGS)
        sock = bind_listener(config.host, config.port, reuse_port=True)
        server = uvicorn.Server(config)
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # Ctrl-C reaches every process of the terminal's group: uvicorn stops gracefully,
        # then raises SIGINT again with Python's handler, which the supervisor's stop
        # makes no error of
        sys.exit(0)
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def _stop_with(supervisor: int) -> None:
    """Have Linux send this worker SIGTERM (uvicorn's graceful stop) when the supervisor
    dies, however it dies; exit now if it already has."""
    errno = parent_death_signal(signal.SIGTERM)
    if errno:
        log.warning(
            "worker %s will outlive a killed supervisor: prctl failed (errno %s)",
            os.getpid(),
            errno,
        )
    if os.getppid() != supervisor:  # it died before the request above took effect
        sys.exit(0)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
