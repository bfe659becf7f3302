"""The `hongbao` command: serve, worker, migrate, audit, recover, token.

With no Redis URL (no ``--redis-url``, no ``HONGBAO_REDIS_URL``), ``hongbao serve``
runs everything in one command: an embedded Valkey server and an SQLite ledger
under ``--data-dir``, the persister and the expiry sweeper in-process.

Exit codes: 0 done, 1 a server or database failed, 2 bad input or configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from hongbao.auth import (
    DEFAULT_TTL,
    SECRET_FILE,
    issue_tokens,
    load_or_create_secret,
    secret_from_env_or_dir,
    valid_user_id,
)
from hongbao.console import err, fail, friendly_errors, run_async, setup_logging
from hongbao.errors import ConfigurationError, HongbaoError, InvalidRequest
from hongbao.settings import Settings

if TYPE_CHECKING:  # the heavy imports wait until a command needs them (`token` stays fast)
    from hongbao.storage.embedded import EmbeddedServer

T = TypeVar("T")

DEFAULT_DATA_DIR = Path("hongbao-data")

app = typer.Typer(
    name="hongbao",
    help="Red-packet (红包) service: HTTP API, workers and tools.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="HONGBAO_DATA_DIR",
        help="Folder for the embedded server's data, the SQLite ledger and the secret.",
        file_okay=False,
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="HONGBAO_REDIS_URL",
        help="redis://, rediss://, redis+sentinel://, redis+cluster:// (default: embedded).",
        show_default=False,
    ),
]
DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="HONGBAO_DATABASE_URL",
        help="PostgreSQL, MySQL/MariaDB or SQLite URL (default: SQLite in the data dir).",
        show_default=False,
    ),
]


class _Stop(BaseException):
    """Raised by our SIGTERM/SIGINT handler outside uvicorn's own signal handling."""


def _settings(
    data_dir: Path, redis_url: str | None, database_url: str | None
) -> tuple[Settings, EmbeddedServer | None]:
    """Settings from flags/environment; starts the embedded server when no Redis URL is set."""
    from hongbao.runtime import embedded_settings, ledger_url

    if not redis_url:
        return embedded_settings(data_dir, database_url=database_url)
    return Settings.from_env(
        redis_url=redis_url, database_url=database_url or ledger_url(data_dir)
    ), None


async def _preflight(settings: Settings) -> None:
    """Connect and migrate once, so that a bad URL is a clear message and not a traceback."""
    from hongbao.runtime import running_service

    async with running_service(settings, workers=False) as runtime:
        if not await runtime.service.store.ping():
            raise ConnectionError(f"Redis at {_safe(settings.redis_url)} does not answer")


def _safe(url: str) -> str:
    """A URL without its password."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, cred = head.partition("://")
    return f"{scheme}://{cred.split(':', 1)[0]}:***@{tail}"


def _check_connect(settings: Settings) -> None:
    try:
        run_async(_preflight(settings))
    except (ConfigurationError, InvalidRequest) as exc:
        fail(str(exc), 2)
    except Exception as exc:
        fail(
            f"cannot start: {exc}\n  redis: {_safe(settings.redis_url)}\n"
            f"  database: {_safe(settings.database_url)}",
            1,
        )


# -- serve ------------------------------------------------------------------------------------


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
        from hongbao.api.workers import SHUTDOWN_TIMEOUT  # here: it imports uvicorn

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


@app.command()
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
            help="Run the persister and expiry sweeper in this command (else: hongbao worker).",
        ),
    ] = True,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
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
) -> None:
    """Run the HTTP API (with no Redis URL: an embedded server and SQLite under --data-dir)."""
    import uvicorn

    from hongbao.api.app import ENV_DATA_DIR, ENV_DEMO, ENV_METRICS_DIR, create_app
    from hongbao.api.workers import serve_workers, uvicorn_options
    from hongbao.metrics import workers_folder

    if log_level.lower() not in ("debug", "info", "warning", "error"):
        fail(f"--log-level must be debug, info, warning or error, not {log_level!r}")
    if ack is not None:
        from hongbao.durability import ACK_MODES

        if ack.lower() not in ACK_MODES:
            fail(f"--ack must be one of {', '.join(ACK_MODES)}, not {ack!r}")
        os.environ["HONGBAO_ACK_MODE"] = ack.lower()  # read by Settings.from_env (and workers)
    setup_logging(log_level)
    data_dir = data_dir.resolve()
    stop_requested: list[int] = []

    def note(sig: int, frame: FrameType | None) -> None:
        stop_requested.append(sig)

    def stop_now(sig: int, frame: FrameType | None) -> None:
        raise _Stop

    previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    server: EmbeddedServer | None = None
    background: BackgroundWorkers | None = None
    metrics_dir: Path | None = None
    try:
        with friendly_errors():
            secret = secret_from_env_or_dir(os.environ.get("HONGBAO_SECRET"), data_dir)
            settings, server = _settings(data_dir, redis_url, database_url)
        _check_connect(settings)
        embedded = server is not None
        for s in previous:
            signal.signal(s, stop_now)
        if stop_requested:
            raise _Stop
        where = f"[{host}]" if ":" in host else host
        backing = (
            f"embedded Redis + SQLite in {data_dir}"
            if embedded
            else f"redis {_safe(settings.redis_url)}, database {_safe(settings.database_url)}"
        )
        err.print(
            f"[bold green]hongbao[/] serving on [bold]http://{where}:{port}[/]  ({backing})",
            markup=True,
            soft_wrap=True,
        )
        options = uvicorn_options(host, port, log_level.lower(), access_log)
        if workers == 1:
            uvicorn.run(
                create_app(settings, secret, run_workers=persister, demo_mode=embedded), **options
            )
        else:
            metrics_dir = workers_folder(data_dir)
            os.environ.update(
                HONGBAO_REDIS_URL=settings.redis_url,
                HONGBAO_DATABASE_URL=settings.database_url,
                **{
                    ENV_DATA_DIR: str(data_dir),
                    ENV_DEMO: "1" if embedded else "0",
                    ENV_METRICS_DIR: str(metrics_dir),
                },
            )
            if persister:
                background = BackgroundWorkers(settings)
                background.start()
            try:
                code = serve_workers(
                    "hongbao.api.app:app_from_env", workers, {**options, "factory": True}
                )
            except OSError as exc:
                fail(str(exc.strerror or exc))
            if code:
                fail("a worker could not start (see its log above)", code)
    except _Stop:
        pass
    finally:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)  # a second ^C must not interrupt the cleanup
        try:
            if background is not None:
                background.stop()
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        finally:
            if server is not None:
                server.stop()
                err.print("embedded server stopped", style="dim")
            for s, handler in previous.items():
                signal.signal(s, handler)


# -- worker, migrate ---------------------------------------------------------------------------


@app.command()
def worker(
    redis_url: RedisUrl = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the persister and the expiry sweeper only (no HTTP)."""
    if not redis_url:
        fail(
            "hongbao worker needs --redis-url or HONGBAO_REDIS_URL "
            "(the embedded default runs its workers inside hongbao serve)"
        )
    from hongbao.runtime import ledger_url, running_service

    setup_logging(log_level)
    settings = Settings.from_env(
        redis_url=redis_url, database_url=database_url or ledger_url(data_dir)
    )

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


@app.command()
def migrate(
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Bring the ledger's schema up to date."""
    from hongbao.ledger import SqlLedger
    from hongbao.runtime import ledger_url

    url = database_url or ledger_url(data_dir)
    if not database_url:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    async def run() -> None:
        ledger = SqlLedger.from_url(url)
        try:
            await ledger.migrate()
        finally:
            await ledger.aclose()

    with friendly_errors():
        try:
            run_async(run())
        except HongbaoError:
            raise
        except Exception as exc:
            fail(f"migration failed on {_safe(url)}: {exc}", 1)
    err.print(f"ledger {_safe(url)} is up to date", style="green")


# -- audit, recover ---------------------------------------------------------------------------


@app.command()
def audit(
    redis_url: RedisUrl = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Check every money invariant; exit 1 naming the packet or wallet on a violation."""
    from hongbao.audit import main as audit_main

    with friendly_errors():
        code = audit_main(data_dir, redis_url, database_url, do_recover=False)
    raise typer.Exit(code)


@app.command()
def recover(
    redis_url: RedisUrl = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Rebuild Redis state of open packets from the ledger, then audit (safe to repeat)."""
    from hongbao.audit import main as audit_main

    with friendly_errors():
        code = audit_main(data_dir, redis_url, database_url, do_recover=True)
    raise typer.Exit(code)


@app.command("dead-letters")
def dead_letters(
    retry: Annotated[
        list[str] | None,
        typer.Option(
            "--retry",
            metavar="b<BUCKET>/<ID>",
            help="Put this parked entry back on its event stream (repeatable).",
        ),
    ] = None,
    retry_all: Annotated[
        bool, typer.Option("--retry-all", help="Put every parked entry back.")
    ] = False,
    resolve: Annotated[
        list[str] | None,
        typer.Option(
            "--resolve",
            metavar="b<BUCKET>/<ID>",
            help="Set this entry aside, never to be applied (repeatable; needs --note).",
        ),
    ] = None,
    note: Annotated[str, typer.Option(help="Why the --resolve entries are set aside.")] = "",
    redis_url: RedisUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """List the events the persister parked, with why; exit 1 while any are left.

    Fix the cause first (the reason says it), then retry: the persister applies the
    entries again, and the ledger applies each claim and refund only once. An entry
    that must never be applied is resolved, with a note, and kept for the record."""
    from hongbao.dead_letters import main as dead_letters_main

    if sum((bool(retry), retry_all, bool(resolve))) > 1:
        fail("give one of --retry, --retry-all and --resolve")
    if note and not resolve:
        fail("--note goes with --resolve")
    with friendly_errors():
        code = dead_letters_main(
            data_dir,
            redis_url,
            retry_refs=retry,
            retry_all=retry_all,
            resolve_refs=resolve,
            note=note,
        )
    raise typer.Exit(code)


# -- token ------------------------------------------------------------------------------------


@app.command()
def token(
    users: Annotated[
        list[str],
        typer.Argument(
            help="User ids (1-64 of A-Z a-z 0-9 _ . : @ -); '-' reads them from stdin.",
        ),
    ],
    admin: Annotated[bool, typer.Option("--admin", help="Admin tokens (deposits).")] = False,
    ttl: Annotated[int, typer.Option(min=1, help="Seconds until the tokens expire.")] = DEFAULT_TTL,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Print a bearer token per user, one per line, in the order given."""
    if "-" in users:
        users = [u for arg in users for u in (sys.stdin.read().split() if arg == "-" else [arg])]
    bad = next((u for u in users if not valid_user_id(u)), None)
    if bad is not None:
        fail(f"invalid user id {bad!r}: use 1-64 characters of letters, digits and _ . : @ -")
    env_secret = os.environ.get("HONGBAO_SECRET")
    with friendly_errors():
        if env_secret is not None and env_secret.strip():
            secret = secret_from_env_or_dir(env_secret, None)
        elif (data_dir / SECRET_FILE).is_file():
            secret = load_or_create_secret(data_dir)
        else:
            fail(
                f"no secret: {data_dir / SECRET_FILE} does not exist. Start `hongbao serve "
                f"--data-dir {data_dir}` once, or set HONGBAO_SECRET."
            )
        tokens = issue_tokens(secret, users, admin=admin, ttl=ttl)
    sys.stdout.write("\n".join(tokens) + "\n")
    sys.stdout.flush()


@app.command(
    "bench",
    # every argument, --help included, goes to the benchmark's own command
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
    help="Benchmark hongbao against seed 002's client, redis-benchmark and seed 003's "
    "designs (its options: hongbao bench --help).",
)
def bench(ctx: typer.Context) -> None:
    # imported here: the service's commands never load the benchmark package
    try:
        from hongbao_bench.command import main as run_bench
    except ImportError as exc:
        from rich.markup import escape  # fail() prints Rich markup: keep [bench] as text

        fail(
            escape(
                f"hongbao bench needs the hongbao_bench package ({exc}): "
                "install hongbao with its benchmark, pip install 'hongbao[bench]'"
            )
        )
    run_bench(ctx.args, ctx.command_path)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
