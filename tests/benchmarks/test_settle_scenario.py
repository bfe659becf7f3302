"""`hongbao bench --size tiny --scenarios settle`: every drain row and both storms run,
audit clean and report their figures and targets; and the scenario's Redis database is
the bench's next one.

The bench starts its own embedded server; the drain rows use HONGBAO_TEST_POSTGRES_URL /
HONGBAO_TEST_MYSQL_URL as admin connections (private databases, dropped afterwards).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hongbao.cli import app
from hongbao_bench.settle_scenario import own_database
from tests.conftest import IN_CI

POSTGRES_URL = os.environ.get(
    "HONGBAO_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("HONGBAO_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


@pytest.mark.timeout(180)
def test_settle_drains_and_storms_settle_every_claim_once(tmp_path: Path) -> None:
    if shutil.which("wrk") is None and not IN_CI:
        pytest.skip("wrk is not installed")
    out = tmp_path / "bench.json"
    args = ["bench", "--size", "tiny", "--scenarios", "settle", "--json", str(out)]
    args += ["--postgres-url", POSTGRES_URL, "--mysql-url", MYSQL_URL]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    rows = {row["scenario"]: row for row in data["scenarios"]}
    drains = ["settle-drain@postgresql", "settle-drain-2@postgresql", "settle-drain@mariadb"]
    drains.append("settle-drain@sqlite")
    storms = ["settle-storm@embedded", "settle-storm@postgresql"]
    assert set(rows) == {*drains, *storms}
    wanted = {"ok"} if IN_CI else {"ok", "skipped"}
    for name in [*drains, *storms]:
        assert rows[name]["status"] in wanted, rows[name]
    assert rows["settle-drain@sqlite"]["status"] == "ok"
    for name in drains:
        f = rows[name]["figures"]
        if rows[name]["status"] != "ok":
            continue
        assert f["claims"] == 2_000 and f["rps"] > 0, f  # tiny: 20 packets of 100 shares
        assert f["persister_us_per_claim"] > 0 and f["redis_us_per_claim"] > 0, f
    assert rows["settle-drain-2@postgresql"]["figures"].get("persisters", 2) == 2
    for name in storms:
        f = rows[name]["figures"]
        if rows[name]["status"] != "ok":
            continue
        assert f["claims"] > 0 and f["reads"] > 0, f
        # every claim was seen in the ledger, later than it was granted
        assert 0 < f["p50_ms"] <= f["p99_ms"] <= f["lag_max_ms"], f
        assert f["max_backlog_claims"] > 0 and f["max_backlog_seconds"] is not None, f
    names = {t["name"] for t in data["targets"]}
    assert "one persister on sqlite, claims/s" in names
    if rows["settle-storm@embedded"]["status"] == "ok":
        assert "storm on embedded: grab-to-credit lag p99" in names


def test_the_scenario_streams_live_in_the_next_redis_database() -> None:
    assert own_database("redis://127.0.0.1:6379/7") == "redis://127.0.0.1:6379/8"
    assert own_database("redis://127.0.0.1:6379") == "redis://127.0.0.1:6379/1"
    assert own_database("redis://127.0.0.1:6379/15") == "redis://127.0.0.1:6379/0"
    socket = "unix:///tmp/hongbao%20data/valkey.sock"
    assert own_database(f"{socket}?db=0") == f"{socket}?db=1"
    with pytest.raises(ValueError, match="one-server"):
        own_database("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
