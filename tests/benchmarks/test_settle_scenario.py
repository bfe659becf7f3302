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
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine
from typer.testing import CliRunner

from hongbao.cli import app
from hongbao.ledger.schema import claims
from hongbao_bench.settle_scenario import LOOKBACK_IDS, _read_settled, _Samples, own_database
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


async def test_the_storm_sampler_sees_rows_that_commit_out_of_id_order(tmp_path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'claims.db'}")
    async with engine.begin() as conn:
        await conn.run_sync(claims.create)
    now = datetime.now(UTC).replace(tzinfo=None)

    async def commit(*ids: int) -> None:
        rows = [
            {"id": i, "packet_id": "p", "share_idx": i, "user_id": f"u{i}", "amount": 1}
            for i in ids
        ]
        async with engine.begin() as conn:
            await conn.execute(claims.insert(), [{**r, "claimed_at": now} for r in rows])

    samples = _Samples()
    try:
        await commit(1, 2, 3, 6, 7)  # 4 and 5: another lane's transaction, in flight
        await _read_settled(engine, samples)
        assert (samples.seen, samples.last_id, samples.unseen_from) == (5, 7, 4)
        await commit(4, 5, 8)
        await _read_settled(engine, samples)
        assert (samples.seen, samples.unseen_from) == (8, 9)
        # an id no row will ever have holds the next reads back, within the window only
        await commit(10)
        await _read_settled(engine, samples)
        assert (samples.seen, samples.unseen_from) == (9, 9)
        await commit(10 + LOOKBACK_IDS)
        await _read_settled(engine, samples)
        assert (samples.seen, samples.unseen_from) == (10, 11)
        assert len(samples.lags) == 10 and all(lag >= 0 for lag in samples.lags)
    finally:
        await engine.dispose()
