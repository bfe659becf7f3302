"""Prometheus metrics of the API: grabs by outcome, grab latency, two gauges read from
Redis at scrape time (persister backlog, dead-lettered entries), and withdrawals by
outcome, the age of the oldest one in flight and the webhook queue's gauges read from the
ledger at scrape time.

Under `hongbao serve --workers N` a scrape reaches one worker, so the workers share a
folder: each writes its grab tally there every `PUBLISH_SECONDS`, and the worker that
answers a scrape adds the others' files to its own live numbers. The others' part is up
to that long behind. A worker that exited leaves its file, so the totals never drop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from bisect import bisect_left
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import orjson
from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from hongbao.domain.withdrawals import WithdrawalStatus
from hongbao.errors import StorageError
from hongbao.ledger import SqlLedger
from hongbao.ledger.webhook_store import WebhookStore
from hongbao.storage.redis import RedisStore
from hongbao.withdrawals import Withdrawals

__all__ = [
    "CONTENT_TYPE",
    "GRAB_OUTCOMES",
    "PUBLISH_SECONDS",
    "GrabTally",
    "Metrics",
    "WithdrawalTotals",
]

log = logging.getLogger(__name__)

#: how often each worker writes its tally for the others (the lag of their part)
PUBLISH_SECONDS = 1.0

# no *_created series: they would double the output for nothing here
disable_created_metrics()  # type: ignore[no-untyped-call]

#: `outcome` label values of hongbao_grabs_total
GRAB_OUTCOMES = (
    "granted",
    "repeat",
    "exhausted",
    "expired",
    "not_found",
    "invalid",
    "unauthorized",
    "error",
    "rate_limited",
    "not_in_audience",
    "wrong_passphrase",
    "too_many_attempts",
    "not_started",
    "cancelled",
)

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GrabTally(Collector):
    """Grabs by outcome and their latency, kept in plain numbers and exported when scraped.

    prometheus-client's Counter.inc and Histogram.observe take a lock each; a worker's
    grabs all run on its one event loop thread and need none, so the hot path only adds
    to a dict and a list, and `collect` builds the two families at scrape time (what this
    saves a grab: docs/performance.md).
    """

    def __init__(self, shared_dir: Path | None = None) -> None:
        self.outcomes = dict.fromkeys(GRAB_OUTCOMES, 0)
        #: per latency bucket (le = _LATENCY_BUCKETS[i]), then the ones above the last
        self.in_bucket = [0] * (len(_LATENCY_BUCKETS) + 1)
        self.seconds = 0.0
        #: the workers' folder, and this process's file in it (the pid may be reused)
        self.shared_dir = shared_dir
        self._own_file = (
            shared_dir / f"{os.getpid()}-{secrets.token_hex(4)}.json" if shared_dir else None
        )

    def record(self, outcome: str, seconds: float) -> None:
        self.outcomes[outcome] += 1
        self.in_bucket[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        self.seconds += seconds

    def publish(self) -> None:
        """Write this process's tally for the other workers (replaced atomically)."""
        if self._own_file is None:
            return
        data = {"outcomes": self.outcomes, "in_bucket": self.in_bucket, "seconds": self.seconds}
        partial = self._own_file.with_suffix(".partial")
        try:
            partial.write_bytes(orjson.dumps(data))
            os.replace(partial, self._own_file)
        except OSError as exc:
            log.warning("could not write the grab tally to %s: %s", self._own_file, exc)

    def totals(self) -> tuple[dict[str, int], list[int], float]:
        """Grabs by outcome, per latency bucket, and their seconds: this process's numbers
        plus the other workers' last published ones (their files are read once)."""
        outcomes, in_bucket, seconds = dict(self.outcomes), list(self.in_bucket), self.seconds
        if self.shared_dir is None:
            return outcomes, in_bucket, seconds
        for path in self.shared_dir.glob("*.json"):
            if path == self._own_file:
                continue
            other = _read_tally(path)
            if other is None:
                continue
            for outcome, count in other[0].items():
                outcomes[outcome] += count
            in_bucket = [a + b for a, b in zip(in_bucket, other[1], strict=True)]
            seconds += other[2]
        return outcomes, in_bucket, seconds

    def collect(self) -> Iterator[Metric]:
        outcomes, in_bucket, seconds = self.totals()
        grabs = CounterMetricFamily(
            "hongbao_grabs", "Grab requests by outcome.", labels=["outcome"]
        )
        for outcome, count in outcomes.items():
            grabs.add_metric([outcome], count)
        yield grabs
        cumulative, buckets = 0, []
        for bound, count in zip((*_LATENCY_BUCKETS, float("inf")), in_bucket, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        yield HistogramMetricFamily(
            "hongbao_grab_seconds",
            "Time spent answering a grab request, seconds.",
            buckets=buckets,
            sum_value=seconds,
        )


def _read_tally(path: Path) -> tuple[dict[str, int], list[int], float] | None:
    """Another worker's published tally, or None (logged) when it cannot be read."""
    try:
        data = orjson.loads(path.read_bytes())
        outcomes = {o: int(data["outcomes"].get(o, 0)) for o in GRAB_OUTCOMES}
        in_bucket = [int(n) for n in data["in_bucket"]]
        seconds = float(data["seconds"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("skipping the unreadable grab tally %s: %s", path, exc)
        return None
    if len(in_bucket) != len(_LATENCY_BUCKETS) + 1:
        log.warning("skipping the grab tally %s: it has other latency buckets", path)
        return None
    return outcomes, in_bucket, seconds


class WithdrawalTotals(Collector):
    """Withdrawals by outcome, counted by the ledger and read when scraped, so that every
    worker answers with the same totals: `requested` counts every withdrawal made, and
    `completed` and `failed` those whose payout was reported so. With them, the age of
    the oldest withdrawal still requested: a payout the payment system never reported
    keeps the wallet's money in flight until an operator settles it."""

    def __init__(self) -> None:
        #: outcome -> (withdrawals, fen)
        self.totals: dict[str, tuple[int, int]] = {s.value: (0, 0) for s in WithdrawalStatus}
        #: seconds since the oldest withdrawal still requested was made (0: none is)
        self.oldest_requested = 0.0

    async def refresh(self, withdrawals: Withdrawals) -> bool:
        """Read the totals and the oldest requested withdrawal; False (all unchanged) if
        the database does not answer."""
        try:
            by_status = await withdrawals.totals()
            oldest = await withdrawals.oldest_requested()
        except StorageError:
            return False
        age = 0.0 if oldest is None else (datetime.now(UTC) - oldest).total_seconds()
        self.oldest_requested = max(age, 0.0)
        self.totals = {
            WithdrawalStatus.REQUESTED.value: (
                sum(n for n, _ in by_status.values()),
                sum(fen for _, fen in by_status.values()),
            ),
            **{s.value: by_status[s] for s in WithdrawalStatus if s != WithdrawalStatus.REQUESTED},
        }
        return True

    def collect(self) -> Iterator[Metric]:
        count = CounterMetricFamily(
            "hongbao_withdrawals", "Withdrawals by outcome.", labels=["outcome"]
        )
        fen = CounterMetricFamily(
            "hongbao_withdrawals_fen", "Fen of the withdrawals by outcome.", labels=["outcome"]
        )
        for outcome, (n, amount) in self.totals.items():
            count.add_metric([outcome], n)
            fen.add_metric([outcome], amount)
        yield count
        yield fen
        yield GaugeMetricFamily(
            "hongbao_withdrawals_oldest_requested_seconds",
            "Age of the oldest withdrawal still requested: debited, its payout not reported "
            "completed or failed (0 when none is).",
            value=self.oldest_requested,
        )


class Metrics:
    """The metrics of one app, in a private registry (several apps may share a process);
    with `shared_dir`, the grab tallies of all workers sharing it."""

    def __init__(self, shared_dir: Path | None = None) -> None:
        self.registry = CollectorRegistry()
        self.grabs = GrabTally(shared_dir)
        self.registry.register(self.grabs)
        self.backlog = Gauge(
            "hongbao_persister_backlog",
            "Entries in the bucket streams not yet applied to the ledger (a grant entry "
            "holds the grants of one packet in one coalesced call).",
            registry=self.registry,
        )
        self.dead_letters = Gauge(
            "hongbao_dead_letters",
            "Events parked in the dead-letter streams.",
            registry=self.registry,
        )
        self.settle_lag = Gauge(
            "hongbao_settlement_lag_seconds",
            "How far behind the grabs the ledger is, as a persister last reported it: the "
            "age of the oldest entry in its last batch (0 when none reported for 5 s).",
            registry=self.registry,
        )
        self.withdrawals = WithdrawalTotals()
        self.registry.register(self.withdrawals)
        self.webhook_deliveries = Gauge(
            "hongbao_webhook_deliveries",
            "Webhook events by the status of the deliveries that carry them: pending, "
            "delivered, parked (retries ran out, or its endpoint was disabled), and failing "
            "(pending after a failed attempt).",
            ["status"],
            registry=self.registry,
        )
        self.webhook_oldest_pending = Gauge(
            "hongbao_webhook_oldest_pending_seconds",
            "Age of the oldest pending webhook delivery (0 when none is pending).",
            registry=self.registry,
        )

    async def refresh_webhooks(self, ledger: SqlLedger) -> bool:
        """Read the webhook delivery gauges from the ledger; False if it does not answer."""
        try:
            stats = await WebhookStore(ledger).stats()
        except StorageError:
            return False
        for status, count in (
            ("pending", stats.pending),
            ("delivered", stats.delivered),
            ("parked", stats.parked),
            ("failing", stats.failing),
        ):
            self.webhook_deliveries.labels(status).set(count)
        oldest = stats.oldest_pending
        age = 0.0 if oldest is None else (datetime.now(UTC) - oldest).total_seconds()
        self.webhook_oldest_pending.set(max(age, 0.0))
        return True

    async def refresh(self, store: RedisStore) -> bool:
        """Read the gauges from Redis; False (gauges unchanged) if Redis does not answer."""
        try:
            backlog, parked = await store.stream_lengths()
            lag_ms = await store.settle_lag_ms()
        except StorageError:
            return False
        self.backlog.set(backlog)
        self.dead_letters.set(parked)
        self.settle_lag.set((lag_ms or 0) / 1000)
        return True

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def gauge_values(self) -> tuple[float, float]:
        """The persister backlog and dead letters as the last `refresh` read them."""
        return _gauge_value(self.backlog), _gauge_value(self.dead_letters)

    async def publish_forever(self) -> None:
        """Publish the grab tally every `PUBLISH_SECONDS` (a task of each shared worker)."""
        while True:
            await asyncio.sleep(PUBLISH_SECONDS)
            self.grabs.publish()


def _gauge_value(gauge: Gauge) -> float:
    """A label-less gauge's value, without collecting the whole registry (which would
    read the other workers' tally files too)."""
    return next(iter(gauge.collect())).samples[0].value
