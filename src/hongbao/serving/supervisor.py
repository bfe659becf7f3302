"""Keeps the embedded server of `hongbao serve` up: restarts it when it dies.

A thread checks the server a few times a second. When it is gone (killed, crashed, out
of memory), the thread starts it again on the same files (the AOF brings the data back)
and logs it. A server that died without a clean shutdown may have lost its last second
of writes (``appendfsync everysec``) while the persister had already put them in the
ledger; granting those shares again would pay them twice. So before the restarted
server takes its usual socket, `recover_from_ledger` puts back what the ledger holds
(`hongbao.audit.recover`), with no grab able to reach it meanwhile.

Restarts that do not hold (the server fails to start, any step of the restart raises,
or it dies again within `STABLE_SECONDS`) back off; after `MAX_FAILURES` of them in a
row the supervisor gives up and calls `on_give_up`, so that `serve` exits non-zero and
the service manager (systemd, Kubernetes) restarts the whole service. While the server
is down, requests answer 503 and ``/readyz`` says so.

A server that exits while `serve` stops is not restarted: a service manager that signals
the whole process group (systemd's default ``KillMode=control-group``) stops the server
together with `serve`. `serve` calls `shutting_down` as soon as a stop is asked for; a
server that exited cleanly (status 0, as on SIGTERM) is given `STOP_GRACE` seconds for
that call to come before it is restarted.

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
#: how long a server that exited cleanly waits for serve's stop before it is restarted:
#: a signal sent to serve and the server together may reach the server first
STOP_GRACE = 1.0


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
            log.log(
                logging.WARNING if report.rebuilt or report.repaired_claims else logging.INFO,
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
        #: serve is stopping: a server that exits now is not restarted. A plain flag, not
        #: an Event: a signal handler sets it, and may interrupt the thread that holds an
        #: Event's lock
        self._shutting_down = False
        self._thread = threading.Thread(target=self._run, name="hongbao-embedded", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutting_down(self) -> None:
        """Serve is stopping (a signal handler may call this): keep the server running for
        what serve still does with it, but do not restart it if it exits."""
        self._shutting_down = True

    def stop(self) -> None:
        """Stop watching and stop the server (from the thread that started it, when that
        is the supervisor's, so that it is not left to the parent-death signal)."""
        self._shutting_down = True
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
                if self._stopping_anyway():
                    log.info(
                        "the embedded Redis server exited (status %s) while hongbao serve "
                        "stops; leaving it stopped",
                        self.server.exit_status,
                    )
                    self._stop.wait()
                    return
                log.error(
                    "the embedded Redis server exited (status %s); restarting it",
                    self.server.exit_status,
                )
                failures = self._restart(failures)
                if failures >= MAX_FAILURES:
                    self._give_up(
                        f"the embedded Redis server could not be kept running ({failures} "
                        "failed restarts in a row); stopping hongbao serve"
                    )
                    return
                up_since = time.monotonic()
        except Exception:
            # the thread must not end quietly while serve answers 503 for ever
            log.exception("the embedded Redis server's supervisor failed")
            self._give_up("stopping hongbao serve: its embedded Redis server is not watched")
        finally:
            self.server.stop()  # a server this thread started is stopped by it

    def _stopping_anyway(self) -> bool:
        """True when serve is stopping; a server that exited cleanly (status 0: SIGTERM or
        SHUTDOWN) first waits `STOP_GRACE` for a stop signalled at the same moment."""
        if self.server.exit_status == 0:
            deadline = time.monotonic() + STOP_GRACE
            while not self._shutting_down and time.monotonic() < deadline:
                self._stop.wait(CHECK_EVERY / 2)
        return self._shutting_down

    def _give_up(self, why: str) -> None:
        self.gave_up = True
        log.critical("%s", why)
        self.on_give_up()

    def _restart(self, failures: int) -> int:
        """Restart until one start succeeds or too many failed; the failures in a row
        (the successful start counts: it holds only after STABLE_SECONDS). Any exception
        of an attempt is a failed attempt: a HongbaoError says what went wrong in its
        message, anything else (an OSError of fork or of a full disk) is logged with its
        traceback."""
        while failures < MAX_FAILURES:
            if self._stop.wait(BACKOFF[min(failures, len(BACKOFF) - 1)]):
                return failures
            if self._shutting_down:
                return failures
            failures += 1
            try:
                self.server.restart(self.prepare)
            except HongbaoError as exc:
                log.error("restart %d of the embedded Redis server failed: %s", failures, exc)
                continue
            except Exception as exc:
                log.error(
                    "restart %d of the embedded Redis server failed: %s",
                    failures,
                    exc,
                    exc_info=True,
                )
                continue
            self.restarts += 1
            log.warning(
                "the embedded Redis server is back (pid %s, restart %d in a row)",
                self.server.pid,
                failures,
            )
            return failures
        return failures
