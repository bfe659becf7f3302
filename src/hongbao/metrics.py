"""Prometheus metrics of one API process (each uvicorn worker keeps its own).

Kept small: grabs by outcome, grab latency, and two gauges read from Redis at
scrape time (persister backlog, dead-lettered entries).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from redis.exceptions import RedisError

from hongbao.errors import StorageError
from hongbao.keys import dead_letter_key
from hongbao.storage.redis import RedisStore

__all__ = ["CONTENT_TYPE", "GRAB_OUTCOMES", "Metrics"]

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
)

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The metrics of one app, in a private registry (several apps may share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.grabs = Counter(
            "hongbao_grabs",
            "Grab requests by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        #: the counter of each outcome, looked up once (labels() takes a lock each call)
        self.grab_outcomes = {outcome: self.grabs.labels(outcome) for outcome in GRAB_OUTCOMES}
        self.grab_seconds = Histogram(
            "hongbao_grab_seconds",
            "Time spent answering a grab request, seconds.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
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

    async def refresh(self, store: RedisStore) -> bool:
        """Read the gauges from Redis; False (gauges unchanged) if Redis does not answer."""
        try:
            backlog = await store.backlog()
            parked = 0
            for bucket in range(store.buckets):
                parked += int(await store.client.xlen(dead_letter_key(bucket)))
        except (StorageError, RedisError, OSError):
            return False
        self.backlog.set(backlog)
        self.dead_letters.set(parked)
        return True

    def render(self) -> bytes:
        return generate_latest(self.registry)
