"""Wiring: the service, and the persister + sweeper, built from settings.

`running_service` is what the HTTP app's lifespan and `hongbao worker` use.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from hongbao.history import BestLuckIndexer
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.sweeper import Sweeper
from hongbao.webhooks import Dispatcher

log = logging.getLogger("hongbao.runtime")

#: how long shutdown waits for the persister to finish the batch in hand
STOP_TIMEOUT = 15.0
#: how long a worker whose loop raised waits before it is started again, seconds
RESTART_DELAY = 5.0


@dataclass
class Runtime:
    """A connected service and, when running workers, its persister, sweeper, best-luck
    indexer and webhook dispatcher."""

    service: Hongbao
    persister: Persister | None = None
    sweeper: Sweeper | None = None
    indexer: BestLuckIndexer | None = None
    dispatcher: Dispatcher | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def workers_alive(self) -> bool:
        """False if a worker task ended before shutdown was asked for (its loop returned,
        or the task was cancelled or killed by a BaseException; an Exception restarts
        the loop, see `keep_running`)."""
        return all(not t.done() for t in self.tasks) or self.stop.is_set()


@contextlib.asynccontextmanager
async def running_service(
    settings: Settings, *, workers: bool, passphrase_keys: Sequence[bytes] = ()
) -> AsyncIterator[Runtime]:
    """Connect (and migrate) the service; with `workers`, run the persister, the sweeper,
    the best-luck indexer and the webhook dispatcher.
    `passphrase_keys` digest packet passphrases (the API's service needs them).

    On exit the workers are asked to stop and awaited (the persister finishes the
    batch in hand), then the connections are closed.
    """
    service = await Hongbao.connect(settings, migrate=True, passphrase_keys=passphrase_keys)
    runtime = Runtime(service)
    try:
        if workers:
            runtime.persister = Persister(service.store, service.ledger, settings)
            runtime.sweeper = Sweeper(service)
            runtime.indexer = BestLuckIndexer(service.ledger)
            runtime.dispatcher = Dispatcher(service.ledger, settings)
            loops = {
                "hongbao-persister": runtime.persister.run,
                "hongbao-sweeper": runtime.sweeper.run,
                "hongbao-best-luck": runtime.indexer.run,
                "hongbao-webhooks": runtime.dispatcher.run,
            }
            runtime.tasks = [
                asyncio.create_task(keep_running(name, run, runtime.stop), name=name)
                for name, run in loops.items()
            ]
            for task in runtime.tasks:
                task.add_done_callback(_report_crash)
        settle_heap()
        yield runtime
    finally:
        runtime.stop.set()
        if runtime.tasks:
            _, pending = await asyncio.wait(runtime.tasks, timeout=STOP_TIMEOUT)
            for task in pending:
                log.warning("%s did not stop within %ss; cancelling", task.get_name(), STOP_TIMEOUT)
                task.cancel()
            await asyncio.gather(*runtime.tasks, return_exceptions=True)
        await service.aclose()


#: collect the youngest generation every 20,000 net allocations (CPython: 700); a grab
#: request leaves almost no cycles, so collecting more often only costs CPU
GC_THRESHOLDS = (20_000, 50, 1_000)


def settle_heap() -> None:
    """Move everything alive now (modules, app, connections) out of the collector's sight.

    A full collection walks every tracked object: with SQLAlchemy, pydantic, Starlette
    and redis-py loaded, tens of milliseconds, several times a minute under load, which
    sets the p99 of grab requests. Frozen, the start-up heap is never walked again.
    Objects made later are collected as usual, less often (`GC_THRESHOLDS`), since a grab
    request leaves almost no cycles (figures: docs/performance.md).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def keep_running(
    name: str, run: Callable[[asyncio.Event], Awaitable[None]], stop: asyncio.Event
) -> None:
    """Run a worker's loop until `stop` is set, starting it again `RESTART_DELAY` seconds
    after it raises: the persister and the sweeper move money, and a loop that died on
    one unexpected error would leave grabs unsettled and packets unrefunded while the
    process kept serving. Each failure is logged with its traceback. A loop that
    returns without `stop`, and a cancelled task, end here (`Runtime.workers_alive`)."""
    while True:
        try:
            await run(stop)
            return
        except Exception:
            if stop.is_set():
                raise
            log.exception("%s failed; starting it again in %ss", name, RESTART_DELAY)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RESTART_DELAY)
        if stop.is_set():
            return


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s crashed", task.get_name(), exc_info=task.exception())
