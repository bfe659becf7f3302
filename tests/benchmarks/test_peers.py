"""The ``peers`` scenario: hongbao over HTTP beside the Go and Node.js services."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hongbao.cli import app
from hongbao_bench.common import Outcome
from hongbao_bench.peers import HONGBAO_SHARES, PEERS_DIR_ENV, outcomes_of, peers_dir
from hongbao_bench.report import peers_targets


def run(round_rps: dict[str, float], p99: float = 5.0) -> dict[str, list[dict[str, object]]]:
    """run_peers.py's JSON for one round of each server."""
    rows: dict[str, list[dict[str, object]]] = {}
    for server, rps in round_rps.items():
        result: dict[str, object] = {
            "grab": {"rps": rps, "non2xx": 0, "p99_ms": p99, "requests": 1, "machine_busy_pct": 1},
            "hello": {"rps": 2 * rps, "non2xx": 0, "p99_ms": 1.0, "requests": 1},
        }
        if not server.startswith("hongbao"):
            result["check"] = {"ok": True}
        rows[server] = [result]
    return rows


def test_without_the_peers_directory_the_scenario_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PEERS_DIR_ENV, str(tmp_path / "nowhere"))
    out = tmp_path / "bench.json"
    args = ["bench", "--size", "tiny", "--scenarios", "peers", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["scenarios"]
    assert row["status"] == "skipped"
    assert PEERS_DIR_ENV in row["note"]


def test_targets_compare_hongbao_with_the_best_peer_of_each_shape() -> None:
    found: list[Outcome] = outcomes_of(
        "spread", run({"hongbao": 10_000, "hongbao-np": 30_000, "go": 20_000, "node": 24_000})
    )
    found += outcomes_of("hot", run({"hongbao": 30_000, "go": 25_000}, p99=30.0))
    targets = {t.name: t for t in peers_targets(found)}
    api_node = targets["peers spread: hongbao-np / best peer"]
    assert api_node.value == pytest.approx(1.25) and api_node.met
    embedded = targets["peers spread: hongbao / best peer"]
    assert embedded.value == pytest.approx(10_000 / 24_000) and embedded.met is False
    assert targets["peers hot: hongbao / best peer"].met
    assert targets["peers-spread:hongbao p99"].met
    assert targets["peers-hot:hongbao p99"].met is False


def test_a_peer_whose_claims_do_not_add_up_is_shown_failed() -> None:
    rows = run({"go": 20_000})
    rows["go"][0]["check"] = {"ok": False}
    (row,) = outcomes_of("spread", rows)
    assert row.status == "failed" and "claims off" in row.note


def test_a_hongbao_round_may_end_on_refusals_past_its_shares() -> None:
    rows = run({"hongbao-np": 32_000})
    grab = rows["hongbao-np"][0]["grab"]
    assert isinstance(grab, dict)
    # 320,000 grabs for 300,000 shares: every share granted, then 20,000 refusals
    grab.update(requests=HONGBAO_SHARES + 20_000, non2xx=20_000)
    (row,) = outcomes_of("spread", rows)
    assert row.status == "ok" and "20000 refusals" in row.note
    assert row.figures["rps"] == pytest.approx(32_000 * 300_000 / 320_000)
    # one refusal more: a grab refused while a share was left
    grab.update(non2xx=20_001)
    (row,) = outcomes_of("spread", rows)
    assert row.status == "failed" and "20001 non-2xx" in row.note
    # one fewer: more grants than shares
    grab.update(non2xx=19_999)
    (row,) = outcomes_of("spread", rows)
    assert row.status == "failed"
    # within the shares, any refusal fails the round
    grab.update(requests=1_000, non2xx=1)
    (row,) = outcomes_of("spread", rows)
    assert row.status == "failed" and row.figures["rps"] == 32_000


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_peers_run_beside_hongbao(tmp_path: Path) -> None:
    if peers_dir() is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no peers directory (../shared/peers or ${PEERS_DIR_ENV})")
        pytest.skip("no peers directory")
    out = tmp_path / "bench.json"
    args = ["bench", "--size", "tiny", "--scenarios", "peers", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {r["scenario"]: r for r in json.loads(out.read_text())["scenarios"]}
    assert "peers" not in rows, rows.get("peers")  # not skipped
    for shape in ("spread", "hot"):
        for server in ("hongbao", "hongbao-np", "go", "node", "node-ap"):
            row = rows[f"peers-{shape}:{server}"]
            assert row["status"] == "ok", row
            assert row["figures"]["rps"] > 0
