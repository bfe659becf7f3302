"""Keeps the embedded server of `hongbao serve` up: restarts it when it dies.

A thread checks the server a few times a second. When it is gone (killed, crashed, out
of memory), the thread starts it again on the same files (the AOF brings the data back)
and logs it. A server that died without a clean shutdown may have lost its last second
of writes (``appendfsync everysec``) while the persister had already put them in the
ledger; granting those shares again would pay them twice. So before the restarted
server takes its usual socket, `recover_from_ledger` puts back what the ledger holds
(`hongbao.audit.recover`), with no grab able to reach it meanwhile.

Restarts that do not hold (the server fails to start, or dies again within
`STABLE_SECONDS`) back off; after `MAX_FAILURES` of them in a row the supervisor gives
up and calls `on_give_up`, so that `serve` exits non-zero and the service manager
(systemd, Kubernetes) restarts the whole service. While the server is down, requests
answer 503 and ``/readyz`` says so.

The thread lives as long as `serve`: a server it started dies with it (see
`hongbao.serving.embedded`), so it stops only after stopping the server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from redis.exceptions import RedisError

from hongbao.audit import recover
from hongbao.errors import HongbaoError, StorageError
from hongbao.service import Hongbao
from hongbao.serving.embedded import EmbeddedServer
from hongbao.settings import Settings

log = logging.getLogger("hongbao.embedded")

#: restarts in a row that did not hold before the supervisor gives up
MAX_FAILURES = 5
#: wait before the n-th restart in a row, seconds (the last one repeats)
BACKOFF = (0.0, 0.5, 1.0, 2.0, 4.0)
#: a server up this long has held: the next death starts the count again
STABLE_SECONDS = 10.0
#: how often the thread looks at the server, seconds
CHECK_EVERY = 0.1


def recover_from_ledger(settings: Settings) -> Callable[[str], None]:
    """What a restarted server runs before it serves (see `EmbeddedServer.restart`): the
    claims and packets the ledger holds and the server lost are put back."""

    def prepare(url: str) -> None:
        async def run() -> None:
            service = await Hongbao.connect(replace(settings, redis_url=url))
            try:
                report = await recover(service)
            finally:
                await service.aclose()
            log.warning(
                "recovered from the ledger: %d packet(s) rebuilt, %d claim(s) restored",
                report.rebuilt,
                report.repaired_claims,
            )
            for line in report.conflicts:
                log.error("recover: %s", line)

        try:
            asyncio.run(run())
        except (RedisError, OSError) as exc:
            raise StorageError(f"recovery after the restart failed: {exc}") from exc

    return prepare


class Supervisor:
    """Restart `server` whenever it dies until `stop`; `on_give_up` after too many.
    `prepare` (e.g. `recover_from_ledger`) runs on each restarted server before it serves."""

    def __init__(
        self,
        server: EmbeddedServer,
        on_give_up: Callable[[], None],
        prepare: Callable[[str], None] | None = None,
    ) -> None:
        self.server = server
        self.on_give_up = on_give_up
        self.prepare = prepare
        #: restarts done, and whether the supervisor gave up
        self.restarts = 0
        self.gave_up = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hongbao-embedded", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and stop the server (from the thread that started it, when that
        is the supervisor's, so that it is not left to the parent-death signal)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.server.stop()

    def _run(self) -> None:
        failures = 0
        up_since = time.monotonic()
        try:
            while not self._stop.wait(CHECK_EVERY):
                if self.server.running:
                    if failures and time.monotonic() - up_since >= STABLE_SECONDS:
                        failures = 0
                    continue
                log.error(
                    "the embedded Redis server exited (status %s); restarting it",
                    self.server.exit_status,
                )
                failures = self._restart(failures)
                if failures >= MAX_FAILURES:
                    self.gave_up = True
                    log.critical(
                        "the embedded Redis server could not be kept running (%d failed "
                        "restarts in a row); stopping hongbao serve",
                        failures,
                    )
                    self.on_give_up()
                    return
                up_since = time.monotonic()
        finally:
            self.server.stop()  # a server this thread started is stopped by it

    def _restart(self, failures: int) -> int:
        """Restart until one start succeeds or too many failed; the failures in a row
        (the successful start counts: it holds only after STABLE_SECONDS)."""
        while failures < MAX_FAILURES:
            if self._stop.wait(BACKOFF[min(failures, len(BACKOFF) - 1)]):
                return failures
            failures += 1
            try:
                self.server.restart(self.prepare)
            except HongbaoError as exc:
                log.error("restart %d of the embedded Redis server failed: %s", failures, exc)
                continue
            self.restarts += 1
            log.warning(
                "the embedded Redis server is back (pid %s, restart %d in a row)",
                self.server.pid,
                failures,
            )
            return failures
        return failures
