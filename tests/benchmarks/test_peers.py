"""The ``peers`` scenario: hongbao over HTTP beside the Go and Node.js services."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hongbao.cli import app
from hongbao_bench.common import Outcome
from hongbao_bench.peers import HONGBAO_SHARES, PEERS_DIR_ENV, outcomes_of, peers_dir
from hongbao_bench.peers_runner import role_of
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


#: a runner with run_peers.py's shape: `wrk` runs a child process for each round (a grab
#: round burns CPU for a while, a trivial endpoint's round does not), `main` writes rows
FAKE_RUNNER = textwrap.dedent(
    """
    import json, subprocess, sys

    BURN = "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass"

    def wrk(url, script, env, secs):
        if script:
            subprocess.run([sys.executable, "-c", BURN], check=True)
        return {"rps": 1000.0, "non2xx": 0, "p99_ms": 1.0, "requests": 1000}

    def main():
        grab = wrk("u", "grab script", {}, 1) | {"machine_busy_pct": 50.0}
        rows = {"go": [{"grab": grab, "hello": wrk("u", "", {}, 1), "check": {"ok": True}}]}
        json.dump(rows, open(sys.argv[sys.argv.index("--json") + 1], "w"))
        return 0
    """
)


def test_the_runner_adds_each_grab_rounds_cpu_by_process(tmp_path: Path) -> None:
    runner = tmp_path / "run_peers.py"
    runner.write_text(FAKE_RUNNER)
    out = tmp_path / "rows.json"
    argv = [sys.executable, "-m", "hongbao_bench.peers_runner", str(runner), "--json", str(out)]
    subprocess.run(argv, check=True, timeout=60)
    (round_,) = json.loads(out.read_text())["go"]
    cpu = round_["grab"]["cpu_us"]
    # the round's child (where wrk would be) burned 0.3 s over 1,000 requests
    assert 250 <= cpu["wrk"][0] + cpu["wrk"][1] <= 600
    assert cpu["machine_busy"] >= 250
    assert set(cpu) >= {"server", "main", "valkey", "wrk", "other", "machine_idle"}
    assert "cpu_us" not in round_["hello"]
    (row,) = outcomes_of("spread", json.loads(out.read_text()))
    assert row.figures["cpu_us_a_request"]["wrk"] == cpu["wrk"]


def test_a_runner_without_wrk_runs_without_the_cpu(tmp_path: Path) -> None:
    runner = tmp_path / "run_peers.py"
    runner.write_text("def main():\n    print('ran')\n    return 0\n")
    argv = [sys.executable, "-m", "hongbao_bench.peers_runner", str(runner)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "ran"
    assert "no wrk function" in done.stderr


def test_processes_are_told_apart_by_name_and_parent() -> None:
    assert role_of("python3.11", "hongbao") == "server"  # an API worker of hongbao serve
    assert role_of("python", "bash") == "other"  # any other Python on the machine
    assert role_of("hongbao", "python") == "main"
    assert role_of("valkey-server", "hongbao") == "valkey"
    assert role_of("node", "node") == role_of("peer-go", "python") == "server"
    assert role_of("postgres", "postgres") == "other"


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
            cpu = row["figures"]["cpu_us_a_request"]
            assert sum(cpu["server"]) > 0 and sum(cpu["valkey"]) > 0 and sum(cpu["wrk"]) > 0
        # the embedded default's persister runs in serve's own process
        assert sum(rows[f"peers-{shape}:hongbao"]["figures"]["cpu_us_a_request"]["main"]) > 0
