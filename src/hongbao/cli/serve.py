"""`hongbao serve` (the HTTP API, with the embedded default) and `hongbao worker`."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from hongbao.cli.options import (
    DEFAULT_DATA_DIR,
    AllowEviction,
    DatabaseUrl,
    DataDir,
    LogLevel,
    RedisUrl,
    safe_url,
)
from hongbao.console import err, fail, friendly_errors, run_async, setup_logging
from hongbao.errors import ConfigurationError, InvalidRequest
from hongbao.identity.config import IdentityConfig
from hongbao.settings import ACK_MODES, Settings

if TYPE_CHECKING:  # the heavy imports wait until a command needs them
    from starlette.applications import Starlette

    from hongbao.serving.supervisor import Supervisor


#: variables that give every API host the same identity: without one of them a host
#: would make a secret of its own, and tokens minted on one would fail on another
SHARED_IDENTITY = ("HONGBAO_SECRET", "HONGBAO_JWT_JWKS_URL", "HONGBAO_JWT_PUBLIC_KEY_FILE")
#: seconds the ledger may lag the grabs before the API pauses them, where serve runs its
#: persister in-process and HONGBAO_SETTLE_LAG_TARGET is not set (hongbao.pace)
SERVE_SETTLE_LAG_TARGET = 1.0


class _Stop(BaseException):
    """Raised by our SIGTERM/SIGINT handler outside uvicorn's own signal handling."""


def _settings(data_dir: Path, redis_url: str | None, database_url: str | None) -> Settings:
    """Settings from flags and environment, every one checked (ConfigurationError, one
    line); nothing is started or created. No Redis URL: the embedded server's."""
    from hongbao.ledger.sql import database_url as full_database_url
    from hongbao.serving.embedded import EMBEDDED_CONSUMER, EmbeddedServer, ledger_url, socket_url
    from hongbao.storage import check_url

    database = database_url or ledger_url(data_dir)
    full_database_url(database)
    if redis_url:
        check_url(redis_url)
        return Settings.from_env(redis_url=redis_url, database_url=database)
    server = EmbeddedServer(data_dir)
    server.check()
    settings = Settings.from_env(redis_url=socket_url(server.socket_path), database_url=database)
    # one serve per data folder: a fixed name lets its next run take over at once
    return replace(settings, persister_consumer=settings.persister_consumer or EMBEDDED_CONSUMER)


def _require_shared_identity() -> None:
    if not any(os.environ.get(name, "").strip() for name in SHARED_IDENTITY):
        raise ConfigurationError(
            "with --redis-url every API host must verify the same tokens: set "
            f"{' or '.join(SHARED_IDENTITY)} (a secret made in the data folder is this host's only)"
        )


async def _preflight(settings: Settings) -> None:
    """Connect and migrate once, so that a bad URL is a clear message and not a traceback."""
    from hongbao.runtime import running_service

    async with running_service(settings, workers=False) as runtime:
        if not await runtime.service.store.ping():
            raise ConnectionError(f"Redis at {safe_url(settings.redis_url)} does not answer")


def _check_connect(settings: Settings) -> None:
    try:
        run_async(_preflight(settings))
    except (ConfigurationError, InvalidRequest) as exc:
        fail(str(exc), 2)
    except Exception as exc:
        fail(
            f"cannot start: {exc}\n  redis: {safe_url(settings.redis_url)}\n"
            f"  database: {safe_url(settings.database_url)}",
            1,
        )


# -- serve ------------------------------------------------------------------------------------

DEMO_BANNER = (
    "DEMO MODE: anyone who reaches this server can sign in as demo-<name> and gets 100 yuan "
    "of play money. Never run it with real money."
)


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_trusted_proxies(text: str) -> list[str]:
    """The addresses and networks of --trusted-proxies; exit 2 naming a malformed one."""
    proxies = [part.strip() for part in text.split(",") if part.strip()]
    for proxy in proxies:
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            fail(f"--trusted-proxies: {proxy!r} is not an address or a network (CIDR)")
    return proxies


class BackgroundWorkers:
    """The persister and sweeper on their own event loop in a thread (for --workers N)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="hongbao-workers", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        from hongbao.serving.workers import SHUTDOWN_TIMEOUT  # here: it imports uvicorn

        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(SHUTDOWN_TIMEOUT + 20)

    def _main(self) -> None:
        try:
            run_async(self._serve())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        from hongbao.runtime import running_service

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with running_service(self.settings, workers=True):
            self._ready.set()
            await self._stop.wait()


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    redis_url: RedisUrl = None,
    database_url: DatabaseUrl = None,
    workers: Annotated[
        int, typer.Option(min=1, max=256, help="API processes (uvicorn workers).")
    ] = 1,
    persister: Annotated[
        bool,
        typer.Option(
            "--persister/--no-persister",
            help="Run the persister and expiry sweeper in this command (else: hongbao "
            "worker; needs --redis-url).",
        ),
    ] = True,
    log_level: LogLevel = "info",
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = False,
    ack: Annotated[
        str | None,
        typer.Option(
            "--ack",
            envvar="HONGBAO_ACK_MODE",
            help="Answer a grab after: redis (the script), aof (WAITAOF), replica (WAIT) "
            "or ledger (SQL commit). Default: redis.",
            show_default=False,
        ),
    ] = None,
    allow_eviction: AllowEviction = False,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="Demo sign-in: anyone may sign in as demo-<name> with 100 yuan of play money.",
        ),
    ] = False,
    demo_public: Annotated[
        bool,
        typer.Option("--demo-public", help="Allow --demo on an address other than loopback."),
    ] = False,
    trusted_proxies: Annotated[
        str,
        typer.Option(
            "--trusted-proxies",
            envvar="HONGBAO_TRUSTED_PROXIES",
            help="Comma-separated addresses or CIDRs of proxies whose X-Forwarded-For "
            "names the client (default: none; the socket peer is the client).",
        ),
    ] = "",
    metrics_host: Annotated[
        str | None,
        typer.Option(
            "--metrics-host",
            envvar="HONGBAO_METRICS_HOST",
            help="Serve /metrics on this address only (with --metrics-port), not on the API's.",
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            envvar="HONGBAO_METRICS_PORT",
            min=1,
            max=65535,
            help="Port of the /metrics listener (with --metrics-host, default 127.0.0.1).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the HTTP API (with no Redis URL: an embedded server and SQLite under --data-dir).

    Everything is checked before anything starts: the settings, the URLs, the data
    folder, then the listening port; a problem is one line and exit code 2."""
    from hongbao.app import (
        ENV_DATA_DIR,
        ENV_DEMO,
        ENV_METRICS_ADDRESS,
        ENV_METRICS_DIR,
        create_app,
    )
    from hongbao.serving.workers import bind_listener, check_port_free, workers_folder

    if demo and not demo_public and not is_loopback(host):
        fail(
            f"--demo on {host} lets anyone on the network sign in with play money; "
            "add --demo-public if that is what you want"
        )
    proxies = parse_trusted_proxies(trusted_proxies)
    if metrics_host is not None and metrics_port is None:
        fail("--metrics-host needs --metrics-port")
    metrics_address = None if metrics_port is None else (metrics_host or "127.0.0.1", metrics_port)
    if metrics_port is not None and metrics_port == port:
        # both listeners share their port (SO_REUSEPORT): the kernel would spread the API's
        # connections over the metrics-only listener too
        fail(f"--metrics-port must differ from --port ({port})")
    if log_level.lower() not in ("debug", "info", "warning", "error"):
        fail(f"--log-level must be debug, info, warning or error, not {log_level!r}")
    if ack is not None:
        if ack.lower() not in ACK_MODES:
            fail(f"--ack must be one of {', '.join(ACK_MODES)}, not {ack!r}")
        os.environ["HONGBAO_ACK_MODE"] = ack.lower()  # read by Settings.from_env (and workers)
    if allow_eviction:
        os.environ["HONGBAO_ALLOW_EVICTION"] = "1"  # read by Settings.from_env (and workers)
    if not persister and not redis_url:
        fail(
            "--no-persister needs --redis-url: on the embedded server this command's "
            "persister is the one that moves grabs into the ledger"
        )
    pace = default_settle_lag_target(persister, os.environ)
    if pace is not None:
        os.environ["HONGBAO_SETTLE_LAG_TARGET"] = pace  # read by Settings.from_env (and workers)
    setup_logging(log_level)
    data_dir = data_dir.resolve()
    embedded = not redis_url
    with friendly_errors():
        settings = _settings(data_dir, redis_url, database_url)
        if not embedded:
            _require_shared_identity()
        # the port before anything starts: a busy port leaves no server or file behind
        if workers == 1:
            listener: socket.socket | None = bind_listener(host, port)
        else:
            check_port_free(host, port)
            listener = None
        if metrics_address is not None:
            check_port_free(*metrics_address)
    stop_requested: list[int] = []
    supervisor: Supervisor | None = None

    def stopping() -> None:
        """A stop was asked for (a signal handler's first step): an embedded server that
        exits from now on, e.g. signalled with serve by systemd, is not restarted."""
        if supervisor is not None:
            supervisor.shutting_down()

    def note(sig: int, frame: FrameType | None) -> None:
        stopping()
        stop_requested.append(sig)

    def stop_now(sig: int, frame: FrameType | None) -> None:
        stopping()
        raise _Stop

    previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    background: BackgroundWorkers | None = None
    metrics_dir: Path | None = None
    try:
        with friendly_errors():
            if embedded or not database_url:  # the embedded server's or the ledger's folder
                data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            identity = IdentityConfig.from_env(data_dir=data_dir)
            if embedded:
                supervisor = _start_embedded(data_dir, settings)
        _check_connect(settings)
        if supervisor is not None and supervisor.server.recovery_pending:
            _recover_at_start(settings, supervisor)
        for s in previous:
            signal.signal(s, stop_now)
        if stop_requested:
            raise _Stop
        where = f"[{host}]" if ":" in host else host
        backing = (
            f"embedded Redis + SQLite in {data_dir}"
            if embedded
            else f"redis {safe_url(settings.redis_url)}, database {safe_url(settings.database_url)}"
        )
        err.print(
            f"[bold green]hongbao[/] serving on [bold]{escape(f'http://{where}:{port}')}[/]"
            f"  ({escape(backing)})",
            markup=True,
            soft_wrap=True,
        )
        if demo:
            err.print(DEMO_BANNER, style="bold yellow", soft_wrap=True)
        if listener is not None:
            app = create_app(
                settings,
                identity,
                run_workers=persister,
                demo_mode=demo,
                metrics_address=metrics_address,
            )
            _run_uvicorn(
                app, listener, host, port, log_level.lower(), access_log, proxies, stopping
            )
        else:
            metrics_dir = workers_folder(data_dir)
            os.environ.update(
                HONGBAO_REDIS_URL=settings.redis_url,
                HONGBAO_DATABASE_URL=settings.database_url,
                **{
                    ENV_DATA_DIR: str(data_dir),
                    ENV_DEMO: "1" if demo else "0",
                    ENV_METRICS_ADDRESS: (
                        "" if metrics_address is None else "{}:{}".format(*metrics_address)
                    ),
                    ENV_METRICS_DIR: str(metrics_dir),
                },
            )
            if persister:
                background = BackgroundWorkers(settings)
                background.start()
            nice = settings.worker_nice if persister else 0
            _run_workers(
                host, port, log_level.lower(), access_log, proxies, workers, nice, stopping
            )
    except _Stop:
        pass
    finally:
        stopping()
        for s in previous:
            signal.signal(s, signal.SIG_IGN)  # a second ^C must not interrupt the cleanup
        try:
            if listener is not None:
                listener.close()
            if background is not None:
                background.stop()
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        finally:
            if supervisor is not None:
                supervisor.stop()
                err.print("embedded server stopped", style="dim")
            for s, handler in previous.items():
                signal.signal(s, handler)
    if supervisor is not None and supervisor.gave_up:
        fail("the embedded Redis server could not be kept running (see the log above)", 1)


def default_settle_lag_target(settles: bool, environ: Mapping[str, str]) -> str | None:
    """HONGBAO_SETTLE_LAG_TARGET for a `serve` that runs its persister in-process
    (`settles`) and was given none: its API and its persister share the machine, so
    grabs pause while the ledger lags (hongbao.pace). None: leave the setting as it is."""
    if settles and not environ.get("HONGBAO_SETTLE_LAG_TARGET", "").strip():
        return str(SERVE_SETTLE_LAG_TARGET)
    return None


def _start_embedded(data_dir: Path, settings: Settings) -> Supervisor:
    """Start the embedded server and the thread that restarts it when it dies; if that
    fails for good, this process is asked to stop (SIGTERM) and serve exits 1."""
    from hongbao.serving.embedded import EmbeddedServer
    from hongbao.serving.supervisor import Supervisor, recover_from_ledger

    server = EmbeddedServer(data_dir)
    server.start()  # from this thread, which lives as long as serve (see embedded.py)
    supervisor = Supervisor(
        server,
        on_give_up=lambda: os.kill(os.getpid(), signal.SIGTERM),
        prepare=recover_from_ledger(settings),
    )
    supervisor.start()
    return supervisor


def _recover_at_start(settings: Settings, supervisor: Supervisor) -> None:
    """Put back into the embedded server what the ledger holds and the server lost, when
    its last run did not stop it cleanly (a power loss may have cut the AOF's last second
    while the ledger kept those claims): before the API starts, so no grab sees the gap."""
    from hongbao.serving.supervisor import recover_from_ledger

    try:
        recover_from_ledger(settings)(settings.redis_url)
    except (ConfigurationError, InvalidRequest) as exc:
        fail(str(exc), 2)
    except Exception as exc:
        fail(f"cannot start: recovering the embedded Redis server from the ledger: {exc}", 1)
    with contextlib.suppress(OSError):  # the next start recovers once more
        supervisor.server.recovered()


def _run_uvicorn(
    app: Starlette,
    listener: socket.socket,
    host: str,
    port: int,
    level: str,
    access_log: bool,
    proxies: list[str],
    on_signal: Callable[[], None],
) -> None:
    """One API process: uvicorn on the socket bound at the start; `on_signal` runs first
    when SIGTERM or SIGINT asks it to stop."""
    import uvicorn

    from hongbao.serving.workers import Server, uvicorn_options

    options = uvicorn_options(host, port, level, access_log, proxies)
    server = Server(uvicorn.Config(app, **options), on_signal)
    server.run(sockets=[listener])
    if not server.started:
        fail("the API could not start (see the log above)", 1)


def _run_workers(
    host: str,
    port: int,
    level: str,
    access_log: bool,
    proxies: list[str],
    workers: int,
    nice: int,
    on_signal: Callable[[], None],
) -> None:
    """N API processes, each with the app built from the environment set above, `nice`
    steps below this process (the persister's) in scheduling priority; `on_signal` runs
    first when SIGTERM or SIGINT asks them to stop."""
    from hongbao.serving.workers import serve_workers, uvicorn_options

    options = {
        **uvicorn_options(host, port, level, access_log, proxies),
        "factory": True,
    }
    with friendly_errors():
        code = serve_workers("hongbao.app:app_from_env", workers, options, nice, on_signal)
    if code:
        fail("the API workers could not be started or kept running (see the log above)", code)


# -- worker -----------------------------------------------------------------------------------


def worker(
    redis_url: RedisUrl = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    log_level: LogLevel = "info",
    consumer_name: Annotated[
        str | None,
        typer.Option(
            "--consumer-name",
            envvar="HONGBAO_PERSISTER_CONSUMER",
            help="The persister's name in the event streams' consumer group; keep it across "
            "restarts to take over what the last run left pending at once "
            "(default: <hostname>-<pid>).",
            show_default=False,
        ),
    ] = None,
    allow_eviction: AllowEviction = False,
) -> None:
    """Run the persister and the expiry sweeper only (no HTTP).

    With no Redis URL it joins the embedded server of the `hongbao serve` running on
    --data-dir."""
    from hongbao.runtime import running_service
    from hongbao.serving.embedded import EmbeddedServer, ledger_url

    setup_logging(log_level)
    data_dir = data_dir.resolve()
    if not redis_url:
        redis_url = EmbeddedServer(data_dir).url_if_running()
        if redis_url is None:
            fail(
                f"no hongbao serve runs on {data_dir}: start it first, or give "
                "--redis-url / HONGBAO_REDIS_URL"
            )
    with friendly_errors():
        settings = Settings.from_env(
            redis_url=redis_url,
            database_url=database_url or ledger_url(data_dir),
            persister_consumer=consumer_name,
            allow_eviction=allow_eviction or None,
        )
        if not database_url:
            data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    async def run() -> bool:
        """True on a requested stop, False if the persister or sweeper died."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with running_service(settings, workers=True) as runtime:
            err.print("hongbao worker: persister and sweeper running", style="green")
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([stopping, *runtime.tasks], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
        err.print("hongbao worker: stopped", style="dim")
        return stop.is_set()

    with friendly_errors():
        if not run_async(run()):
            fail("the persister or the sweeper stopped unexpectedly (see the log above)", 1)
