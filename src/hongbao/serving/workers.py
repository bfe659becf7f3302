"""`hongbao serve --workers N`: N uvicorn processes, each accepting on a socket of its own.

uvicorn's own supervisor binds one socket that all its workers accept from. When many
connections arrive together, whichever worker wakes first accepts most of them: wrk's
64 connections split 54/10, 56/8 and 42/22 between two workers here. A worker with few
connections then idles while their grabs wait on Redis, and the one with most is the
limit. With SO_REUSEPORT each worker listens on a socket of its own on the same port,
and the kernel spreads new connections across the sockets by their addresses.

The supervisor here restarts a worker that dies, stops the others when one cannot
start, and on SIGINT or SIGTERM stops them all (each finishes its requests, as uvicorn's
workers do). Should the supervisor itself be killed outright (SIGKILL, the OOM killer),
Linux sends each worker SIGTERM (PR_SET_PDEATHSIG), so no worker is left serving on
the port with nobody to stop or restart it. Without SO_REUSEPORT (not Linux)
uvicorn's supervisor runs instead.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any, cast

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from hongbao.serving.embedded import process_alive

log = logging.getLogger("hongbao.workers")

#: a worker that fails this soon after it started is not restarted (it would fail again);
#: one killed by a signal is, whenever it dies
MIN_UPTIME = 5.0
#: seconds a stopping worker gives its open requests
SHUTDOWN_TIMEOUT = 10


def uvicorn_options(
    host: str, port: int, log_level: str, access_log: bool, trusted_proxies: list[str]
) -> dict[str, Any]:
    """The uvicorn settings `hongbao serve` runs with (the bench's hello-world too).

    X-Forwarded-For and X-Forwarded-Proto are believed only from `trusted_proxies`
    (addresses or CIDRs); with none, the socket peer is the client, whatever it sends."""
    return {
        "host": host,
        "port": port,
        "log_level": log_level,
        "access_log": access_log,
        "lifespan": "on",
        "timeout_graceful_shutdown": SHUTDOWN_TIMEOUT,
        "server_header": False,
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


def serve_workers(app: str, workers: int, options: dict[str, Any]) -> int:
    """Run `app` (an import string) in `workers` processes until SIGINT or SIGTERM;
    uvicorn `options` as for `uvicorn.run`. Returns an exit code (uvicorn's
    STARTUP_FAILURE when a worker could not start); OSError if the port is taken."""
    if not reuse_port_available():
        uvicorn.run(app, workers=workers, **options)
        return 0
    host, port = options["host"], options["port"]
    _check_port_free(host, port)
    context = multiprocessing.get_context("spawn")
    stopping: list[int] = []

    def stop(sig: int, frame: FrameType | None) -> None:
        stopping.append(sig)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    running: dict[int, tuple[BaseProcess, float]] = {}  # sentinel -> (process, started)

    def start() -> None:
        process = context.Process(target=_worker, args=(app, options, os.getpid()), daemon=False)
        process.start()
        running[process.sentinel] = (process, time.monotonic())

    code = 0
    try:
        for _ in range(workers):
            start()
        while not stopping:
            for sentinel in wait(list(running), timeout=0.5):
                process, started = running.pop(cast(int, sentinel))
                process.join()
                if stopping:
                    break
                exited = process.exitcode or 0
                early = time.monotonic() - started < MIN_UPTIME
                if exited == STARTUP_FAILURE or (exited > 0 and early):
                    log.error("worker %s could not start (exit %s)", process.pid, exited)
                    code = STARTUP_FAILURE
                    stopping.append(0)
                    break
                log.warning("worker %s exited (%s); starting another", process.pid, exited)
                start()
    finally:
        for process, _ in running.values():
            if process.exitcode is None:
                process.terminate()  # SIGTERM: uvicorn's graceful shutdown
        for process, _ in running.values():
            process.join()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code


def _check_port_free(host: str, port: int) -> None:
    """OSError when the port is taken, as uvicorn's own bind: a plain bind, without
    SO_REUSEPORT (which would let a second server share the port of a first)."""
    with socket.socket(_family(host)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _worker(app: str, options: dict[str, Any], supervisor: int) -> None:
    """One worker process: its own listening socket, then uvicorn's server on it."""
    _stop_with(supervisor)
    config = uvicorn.Config(app, **options)  # sets up uvicorn's logging too
    sock = socket.socket(_family(config.host))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((config.host, config.port))
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(STARTUP_FAILURE)


#: prctl option: the signal this process gets when its parent dies (linux/prctl.h)
_PR_SET_PDEATHSIG = 1


def _stop_with(supervisor: int) -> None:
    """Have Linux send this worker SIGTERM (uvicorn's graceful stop) when the supervisor
    dies, however it dies; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning(
            "worker %s will outlive a killed supervisor: prctl failed (errno %s)",
            os.getpid(),
            ctypes.get_errno(),
        )
    if os.getppid() != supervisor:  # it died before the request above took effect
        sys.exit(0)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
