"""Settlement backpressure: grabs slow down while the ledger lags behind them.

A grab is answered from Redis; the persister moves it into the ledger afterwards. When
grabs arrive faster than the persister can settle them, the distance between a grab and
its credit grows without bound. Each persister reports that distance after every batch
it applies (the age of the batch's oldest entry, `Persister`), in a Redis key that
expires when no persister reports. Every API process reads it at most every
`READ_INTERVAL` and, while it is above half of `Settings.settle_lag_target`, pauses each
grab before its script runs: `PAUSE_PER_LAG_SECOND` for each second beyond that, up to
`MAX_PAUSE`. A client that waits for its answer (an app, a browser, a load tester with a
fixed set of connections) then sends fewer grabs, and the lag settles where the grabs
come in as fast as the persister settles them: above half the target, by the pause
that rate takes. A grab is never refused for it; and where no persister reports,
nothing is paused.
"""

from __future__ import annotations

import asyncio
import logging
import time

from hongbao.errors import StorageError
from hongbao.storage import RedisStore

log = logging.getLogger("hongbao.pace")

#: seconds between two reads of the reported lag, per process
READ_INTERVAL = 0.1
#: pause of a grab per second of lag beyond half the target, seconds
PAUSE_PER_LAG_SECOND = 0.002
#: the longest pause of a grab, seconds
MAX_PAUSE = 0.05
#: how long a persister's report holds, ms: longer than one of its batches takes
REPORT_TTL_MS = 5_000


def grab_pause(lag: float | None, target: float) -> float:
    """How long a grab waits, seconds, when the ledger is `lag` seconds behind the grabs
    (None: no persister reports) and may be `target` behind (0: never pause)."""
    if lag is None or target <= 0:
        return 0.0
    return min(MAX_PAUSE, max(0.0, lag - target / 2) * PAUSE_PER_LAG_SECOND)


class SettlementPace:
    """This process's pause before each grab (see the module's description)."""

    def __init__(self, store: RedisStore, target: float) -> None:
        self.store = store
        #: seconds the ledger may lag; 0 turns pacing off
        self.target = target
        #: the current pause of a grab, seconds
        self.pause = 0.0
        self._next_read = 0.0

    async def wait(self) -> None:
        """Pause as long as the reported lag asks, reading it again when it is due."""
        now = time.monotonic()
        if now >= self._next_read:
            self._next_read = now + READ_INTERVAL  # one read at a time, whoever comes next
            await self._read()
        if self.pause:
            await asyncio.sleep(self.pause)

    async def _read(self) -> None:
        try:
            lag_ms = await self.store.settle_lag_ms()
        except StorageError:
            return  # the grab meets Redis's trouble itself; the pause stays as it was
        pause = grab_pause(None if lag_ms is None else lag_ms / 1000, self.target)
        if pause and not self.pause:
            log.warning(
                "settlement is %.1f s behind the grabs (target %.1f s): pausing grabs",
                (lag_ms or 0) / 1000,
                self.target,
            )
        elif self.pause and not pause:
            log.info("settlement caught up: grabs no longer paused")
        self.pause = pause
