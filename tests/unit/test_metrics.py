"""The grab tally exports the same series prometheus-client's Counter and Histogram would."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from hongbao.metrics import _LATENCY_BUCKETS, GRAB_OUTCOMES, Metrics
from hongbao.serving.workers import workers_folder

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


def _without_sum(text: str) -> list[str]:
    return [line for line in _series(text, "hongbao_grab") if "_sum" not in line]


def _sum(text: str) -> float:
    [line] = _series(text, "hongbao_grab_seconds_sum")
    return float(line.split()[-1])


def test_workers_sharing_a_folder_each_report_the_grabs_of_all(tmp_path: Path) -> None:
    """`serve --workers N`: a scrape reaches one worker, and it counts every worker's grabs."""
    one, other, reference = Metrics(tmp_path), Metrics(tmp_path), Metrics()
    for k, (outcome, seconds) in enumerate(SAMPLES):
        (one if k % 2 else other).grabs.record(outcome, seconds)
        reference.grabs.record(outcome, seconds)
    alone = Metrics()
    for k, (outcome, seconds) in enumerate(SAMPLES):
        if not k % 2:
            alone.grabs.record(outcome, seconds)
    # nothing published yet: each worker knows its own grabs only
    assert _without_sum(other.render().decode()) == _without_sum(alone.render().decode())

    one.grabs.publish()
    other.grabs.publish()  # its own file is not counted twice
    for metrics in (one, other):
        text, want = metrics.render().decode(), reference.render().decode()
        assert _without_sum(text) == _without_sum(want)
        assert _sum(text) == pytest.approx(_sum(want))


def test_an_unreadable_tally_of_another_worker_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "torn.json").write_bytes(b'{"outcomes": {"granted": 1')
    (tmp_path / "other-buckets.json").write_bytes(
        orjson.dumps({"outcomes": {"granted": 5}, "in_bucket": [5], "seconds": 1.0})
    )
    (tmp_path / "left.partial").write_bytes(b"not json")  # a write cut short
    metrics, reference = Metrics(tmp_path), Metrics()
    for outcome, seconds in SAMPLES:
        metrics.grabs.record(outcome, seconds)
        reference.grabs.record(outcome, seconds)
    assert metrics.render() == reference.render()


def _gone_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_serve_run_removes_the_folders_of_crashed_runs(tmp_path: Path) -> None:
    root = tmp_path / "data" / "metrics"
    crashed, running, other = root / str(_gone_pid()), root / str(os.getppid()), root / "notes"
    for folder in (crashed, running, other):
        folder.mkdir(parents=True)
        (folder / "tally.json").write_text("{}")
    mine = root / str(os.getpid())  # left by a crashed run that had this pid
    mine.mkdir()
    (mine / "old.json").write_text("{}")

    folder = workers_folder(tmp_path / "data")

    assert folder == mine and folder.is_dir() and list(folder.iterdir()) == []
    assert not crashed.exists()
    assert (running / "tally.json").exists() and (other / "tally.json").exists()


def test_without_a_usable_data_dir_the_folder_is_temporary(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "metrics").write_text("a file where the folder should be")
    for data_dir in (tmp_path / "absent", blocked):
        folder = workers_folder(data_dir)
        try:
            assert folder.is_dir() and folder.parent == Path(tempfile.gettempdir())
        finally:
            folder.rmdir()
    assert not (tmp_path / "absent").exists()  # no data dir is made for it
