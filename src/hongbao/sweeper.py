"""The expiry sweeper: closes packets past their expiry; the refund flows via the persister."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from hongbao.errors import StorageError
from hongbao.service import Hongbao

log = logging.getLogger("hongbao.sweeper")

CLOSED_NOW, NOT_IN_REDIS = 1, 0


class Sweeper:
    """Finds open packets past `expires_at` in the ledger and closes them in Redis.

    close.lua checks the expiry against the Redis server's clock (the same clock
    grabs use) and appends the refund event in the same atomic step. A packet
    Redis lost is rebuilt from the ledger first, so its remainder is refunded too.
    """

    def __init__(self, service: Hongbao) -> None:
        self.service = service
        self.closed = 0
        #: passes, and packets of a pass, that failed with an unexpected exception
        self.failures = 0

    async def sweep_once(self) -> int:
        """Close every open packet past its expiry; returns how many it closed now.

        A packet that fails with anything but a StorageError is logged and skipped, so
        that one bad packet does not hold up the refunds of the packets after it; a
        StorageError (Redis or the database away) ends the pass."""
        ledger = self.service.ledger
        retention_ms = self.service.settings.retention_seconds * 1000
        closed, after = 0, ""
        now = datetime.now(UTC)
        while due := await ledger.open_packets(due_before=now, after_id=after):
            for record in due:
                try:
                    closed += await self._close(record.id, record.sender_id, retention_ms)
                except StorageError:
                    raise
                except Exception:
                    self.failures += 1
                    log.exception("sweeper: closing packet %s failed", record.id)
            after = due[-1].id
        self.closed += closed
        return closed

    async def _close(self, packet_id: str, sender_id: str, retention_ms: int) -> bool:
        """Close one expired packet in Redis, rebuilding it first if Redis lost it."""
        store = self.service.store
        keys = store.keys(packet_id)
        status, _, _ = await store.close_packet(keys, sender_id, retention_ms)
        if status == NOT_IN_REDIS and await self.service.ensure_loaded(packet_id):
            status, _, _ = await store.close_packet(keys, sender_id, retention_ms)
        return bool(status == CLOSED_NOW)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every `sweep_interval` seconds until `stop` is set. A pass that fails is
        logged (anything but a StorageError with its traceback) and the next one comes at
        the next interval: unrefunded packets must not wait for a restart."""
        interval = self.service.settings.sweep_interval
        while not stop.is_set():
            try:
                await self.sweep_once()
            except StorageError as exc:
                log.warning("sweeper: %s", exc)
            except Exception:
                self.failures += 1
                log.exception("sweeper: the pass failed; sweeping again in %ss", interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
