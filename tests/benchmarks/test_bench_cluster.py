"""`hongbao bench` on a real Redis Cluster: the hongbao-cluster scenario at tiny size.

A cluster of this module's own (3 primaries + 3 replicas on loopback, tests/servers.py),
so the session cluster of tests/cluster keeps its keys and topology. No timing is
asserted: only that the figures exist and the audits find nothing wrong.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hongbao.cli import app
from hongbao.service import Hongbao
from hongbao_bench.cluster import buckets_by_primary, cluster_admin, primaries_in_slot_order
from hongbao_bench.cluster_scenario import PacketPool, audited, run_workers
from hongbao_bench.cluster_worker import user_name
from hongbao_bench.common import BenchContext
from hongbao_bench.profiles import profile_for
from tests.cluster.conftest import _start_cluster
from tests.servers import RedisCluster

pytestmark = [pytest.mark.redis_cluster]


@pytest.fixture(scope="module")
def bench_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with _start_cluster(tmp_path_factory.mktemp("bench-cluster")) as cluster:
        yield cluster


@pytest.mark.timeout(240)
def test_bench_on_a_cluster_measures_every_primary(
    bench_cluster: RedisCluster, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    markdown = tmp_path / "bench.md"
    args = ["bench", "--size", "tiny", "--redis-url", bench_cluster.url, "--json", str(out)]
    args += ["--markdown", str(markdown)]
    args += ["--scenarios", "seed-baseline,redis-benchmark,hongbao,memory,hongbao-cluster"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    rows = {row["scenario"]: row for row in data["scenarios"]}
    for name in ("seed-baseline", "redis-benchmark", "redis-benchmark-P16"):
        assert rows[name]["status"] == "skipped" and "CROSSSLOT" in rows[name]["note"]
    assert rows["hongbao"]["status"] == "ok"
    assert len(rows["hongbao"]["figures"]["redis_cpu_pct_by_primary"]) == 3
    assert rows["memory"]["status"] == "ok"
    for name, k in (
        ("hongbao-cluster-single", 1),
        ("hongbao-cluster-1p", 1),
        ("hongbao-cluster-2p", 2),
        ("hongbao-cluster-3p", 3),
    ):
        row = rows[name]
        assert row["status"] == "ok", row
        audit = row["result"]
        assert audit["duplicates"] == 0 and audit["over_issue"] == 0 and audit["conserved"]
        assert audit["extra"]["claimed_count"] == audit["extra"]["shares"]
        figures = row["figures"]
        assert len(figures["per_primary"]) == k
        assert all(p["grabs"] > 0 and p["grabs_per_cpu_s"] for p in figures["per_primary"])
        assert figures["grabs_per_primary_cpu_s"] > 0 and row["grabs_per_second"] > 0
    three = rows["hongbao-cluster-3p"]["figures"]
    assert "grabs_per_primary_cpu_s_of_single_pct" in three
    assert "grabs_per_primary_cpu_s_of_1p_pct" in three
    targets = {t["name"]: t for t in data["targets"]}
    name = "cluster, 3 primaries: grabs per primary CPU-s / single node"
    assert targets[name]["value"] is not None
    assert name in markdown.read_text()


async def test_packets_land_on_the_chosen_primary_and_a_lost_claim_fails(
    bench_cluster: RedisCluster, tmp_path: Path
) -> None:
    ctx = BenchContext(
        redis_url=bench_cluster.url,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'ledger.sqlite3'}",
        work_dir=tmp_path,
        profile=profile_for("tiny", False),
    )
    settings = ctx.settings(max_count=50)
    admin = cluster_admin(ctx.redis_url)
    service = await Hongbao.connect(settings, migrate=True)
    try:
        owned = buckets_by_primary(admin, settings.buckets)
        last = primaries_in_slot_order(admin)[-1]
        owner = {b: n for n, bs in owned.items() for b in bs}
        pool = PacketPool(service, owner, 50, random.Random(1))
        placed = await pool.take([last], 2)
        await pool.forget()
        for packet_id in placed[last]:
            node = admin.get_node_from_key(service.store.keys(packet_id).claims)  # type: ignore[no-untyped-call]
            assert node.name == last
        run = await run_workers(ctx, admin, ctx.redis_url, settings.buckets, placed, 1)
        assert sum(len(r["answers"]) for r in run.results.values()) == 100
        # a claim vanishing from Redis after the grabber was told it won must fail the run
        victim = next(iter(placed[last]))
        await service.store.client.hdel(service.store.keys(victim).claims, user_name(1))
        outcome = await audited("hongbao-cluster-1p", service, run)
        assert outcome.status == "failed"
        assert outcome.result is not None and not outcome.result.conserved
    finally:
        admin.close()
        await service.aclose()
