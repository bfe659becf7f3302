"""`hongbao webhooks`: the operator's view of the webhook queue.

- ``list``: the endpoints and the queue's counts;
- ``failed``: parked deliveries and pending ones whose last attempt failed (exit 1 while
  any delivery is parked);
- ``retry ID`` / ``retry-all``: put them back in the queue, due now, with a fresh retry
  window (the dispatcher of ``hongbao worker`` or ``hongbao serve`` sends them);
- ``enable ID``: an endpoint a 410 Gone disabled receives events again (its parked
  deliveries wait for ``retry-all``);
- ``prune --older-than 30d``: delete the deliveries delivered before then, and the events
  as old that no delivery refers to any more;
- ``dispatch``: a dispatcher in a process of its own, beside the one of ``hongbao
  worker`` or ``hongbao serve``: the dispatchers divide the queue, so a storm's events
  get a core of their own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from hongbao.cli.ledger_work import existing_ledger_url, on_ledger
from hongbao.cli.options import DEFAULT_DATA_DIR, DatabaseUrl, DataDir, LogLevel, age_between
from hongbao.console import err, fail, friendly_errors, run_async, setup_logging

if TYPE_CHECKING:
    from pathlib import Path

    from hongbao.ledger.webhook_records import EndpointRecord
    from hongbao.ledger.webhook_store import WebhookStore

T = TypeVar("T")

app = typer.Typer(
    name="webhooks",
    help="Webhook endpoints and deliveries: list, failed, retry, retry-all, enable, prune, "
    "dispatch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


#: what `prune --older-than` takes
MIN_AGE = timedelta(hours=1)
MAX_AGE = timedelta(days=3650)


def parse_age(value: str) -> timedelta:
    """An age like ``30d``, ``12h`` or ``90m``, from 1 hour to 3650 days: a younger cutoff
    would prune deliveries an operator may still be looking into."""
    return age_between(value, MIN_AGE, MAX_AGE)


def _run(
    database_url: str | None, data_dir: Path, work: Callable[[WebhookStore], Awaitable[T]]
) -> T:
    from hongbao.ledger.webhook_store import WebhookStore

    return on_ledger(database_url, data_dir, lambda ledger: work(WebhookStore(ledger)))


@app.command("list")
def list_endpoints(database_url: DatabaseUrl = None, data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """The endpoints, what they receive, and their events by delivery status."""

    async def work(store: WebhookStore) -> None:
        endpoints, stats = await store.endpoints(), await store.stats()
        for e in endpoints:
            state = "enabled" if e.enabled else f"disabled ({e.disabled_reason})"
            batch = f"  batches of {e.batch_size}" if e.batch_size > 1 else ""
            typer.echo(f"{e.id}  {e.url}  {','.join(e.event_types)}  {state}{batch}")
        if not endpoints:
            typer.echo("no webhook endpoints")
        oldest = "" if stats.oldest_pending is None else f", oldest since {stats.oldest_pending}"
        typer.echo(
            f"events: {stats.pending} pending ({stats.failing} failing{oldest}), "
            f"{stats.delivered} delivered, {stats.parked} parked"
        )

    _run(database_url, data_dir, work)


@app.command("failed")
def failed(
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Show at most this many.")] = 100,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Parked deliveries and failing ones, oldest first; exit 1 while any is parked."""

    async def work(store: WebhookStore) -> int:
        rows = await store.failed(limit)
        for r in rows:
            status = r.last_status if r.last_status is not None else "-"
            more = f" and {r.event_count - 1} more" if r.event_count > 1 else ""
            typer.echo(
                f"{r.id}  {r.status}  {r.event_type}  {r.event_id}{more}  {r.endpoint_id} {r.url}  "
                f"attempts {r.attempts}  last {status}: {r.last_error or ''}"
            )
        if not rows:
            typer.echo("no failed deliveries")
        return sum(r.status == "parked" for r in rows)

    parked = _run(database_url, data_dir, work)
    raise typer.Exit(1 if parked else 0)


@app.command("retry")
def retry(
    delivery_id: Annotated[int, typer.Argument(help="The delivery (see `failed`).", min=1)],
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Send one parked or failing delivery again, now."""

    async def work(store: WebhookStore) -> int:
        return await store.retry(delivery_id)

    if not _run(database_url, data_dir, work):
        fail(
            f"no parked or failing delivery {delivery_id} of an enabled endpoint that no "
            "dispatcher is sending now (see hongbao webhooks failed)"
        )
    err.print(f"delivery {delivery_id} is due again", style="green")


@app.command("retry-all")
def retry_all(database_url: DatabaseUrl = None, data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """Send every parked or failing delivery of the enabled endpoints again, now."""

    async def work(store: WebhookStore) -> int:
        return await store.retry()

    count = _run(database_url, data_dir, work)
    err.print(f"{count} deliveries are due again", style="green")


@app.command("enable")
def enable(
    endpoint_id: Annotated[str, typer.Argument(help="The endpoint (see `list`).")],
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Send events to a disabled endpoint again; then `retry-all` sends its parked ones."""
    from rich.markup import escape  # the id is shown as typed, never read as Rich markup

    async def work(store: WebhookStore) -> EndpointRecord | None:
        return await store.enable_endpoint(endpoint_id)

    if _run(database_url, data_dir, work) is None:
        fail(f"no webhook endpoint {endpoint_id[:40]!r} (see hongbao webhooks list)")
    done = f"endpoint {endpoint_id} is enabled; hongbao webhooks retry-all sends its parked ones"
    err.print(escape(done), style="green", soft_wrap=True)


@app.command("prune")
def prune(
    older_than: Annotated[
        timedelta,
        typer.Option(
            "--older-than",
            help="Delete what is older than this: 30d, 12h or 90m (from 1h to 3650d).",
            parser=parse_age,
            metavar="AGE",
            show_default=False,
        ),
    ],
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Delete the deliveries delivered longer ago than --older-than, then the events as
    old that no delivery refers to any more; pending and parked deliveries stay, and so
    do their events. Batch by batch: it never holds long locks, so it may run anytime."""

    async def work(store: WebhookStore) -> tuple[int, int]:
        return await store.prune(older_than)

    deliveries, events = _run(database_url, data_dir, work)
    err.print(f"deleted {deliveries} delivered deliveries and {events} events", style="green")


@app.command("dispatch")
def dispatch(
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    log_level: LogLevel = "info",
) -> None:
    """Deliver webhooks until stopped (SIGTERM or Ctrl-C), in this process only.

    `hongbao worker` and `hongbao serve` dispatch too; this one divides the queue with
    them, so the events of a storm are sent on a core of their own."""
    import asyncio
    import signal

    from hongbao.errors import StorageError
    from hongbao.ledger import SqlLedger
    from hongbao.ledger.webhook_store import WebhookStore
    from hongbao.settings import Settings
    from hongbao.webhooks import Dispatcher

    setup_logging(log_level)
    url = existing_ledger_url(database_url, data_dir.resolve())
    with friendly_errors():
        settings = Settings.from_env(database_url=url)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        ledger = SqlLedger.from_url(settings.database_url)
        try:
            try:
                await WebhookStore(ledger).stats()
            except StorageError as exc:
                reason = str(exc).splitlines()[0]
                fail(f"cannot read the webhook queue (is the ledger migrated?): {reason}")
            err.print("hongbao webhooks dispatch: running", style="green")
            await Dispatcher(ledger, settings).run(stop)
        finally:
            await ledger.aclose()
        err.print("hongbao webhooks dispatch: stopped", style="dim")

    with friendly_errors():
        run_async(run())
