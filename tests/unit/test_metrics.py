"""The grab tally exports the same series prometheus-client's Counter and Histogram would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from hongbao.metrics import _LATENCY_BUCKETS, GRAB_OUTCOMES, Metrics

SAMPLES = [
    ("granted", 0.0003),
    ("granted", 0.005),  # on a bucket's bound: counted in that bucket (le)
    ("repeat", 0.0051),
    ("exhausted", 0.3),
    ("rate_limited", 9.0),  # above the last bound: only in +Inf
]


def _series(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_tally_matches_the_library_metrics() -> None:
    metrics = Metrics()
    reference = CollectorRegistry()
    counter = Counter("hongbao_grabs", "x", ["outcome"], registry=reference)
    histogram = Histogram("hongbao_grab_seconds", "x", buckets=_LATENCY_BUCKETS, registry=reference)
    for outcome in GRAB_OUTCOMES:
        counter.labels(outcome)
    for outcome, seconds in SAMPLES:
        metrics.grabs.record(outcome, seconds)
        counter.labels(outcome).inc()
        histogram.observe(seconds)
    ours, theirs = metrics.render().decode(), generate_latest(reference).decode()
    for prefix in ("hongbao_grabs_total", "hongbao_grab_seconds_"):
        assert _series(ours, prefix) == _series(theirs, prefix)
