"""`hongbao bench --quick --size tiny` runs every scenario end to end and writes its JSON.

It starts its own embedded server in a temporary folder (no shared Redis is touched); the
seed designs use HONGBAO_TEST_POSTGRES_URL / HONGBAO_TEST_MYSQL_URL as admin connections
(private databases) and are reported as skipped when those servers are not reachable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hongbao.cli import app
from hongbao_bench.scenarios import BY_DEFAULT

POSTGRES_URL = os.environ.get(
    "HONGBAO_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("HONGBAO_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


#: the webhooks scenario's rows
WEBHOOK_ROWS = (
    "webhooks",
    "webhooks+dispatch",
    "webhooks-batched",
    "webhooks-dispatcher",
    "webhooks-dispatcher-batched",
)


@pytest.mark.timeout(120)
def test_bench_quick_tiny_writes_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    markdown = tmp_path / "bench.md"
    args = ["bench", "--quick", "--size", "tiny", "--json", str(out), "--plot", str(plot)]
    args += ["--markdown", str(markdown), "--postgres-url", POSTGRES_URL, "--mysql-url", MYSQL_URL]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    groups = {row["group"] for row in data["scenarios"]}
    assert groups == set(BY_DEFAULT)
    names = {row["scenario"] for row in data["scenarios"]}
    for name in (
        "seed-baseline",
        "redis-benchmark",
        "redis-benchmark-P16",
        "hongbao",
        "hongbao-nocoalesce",
        "hongbao-spread",
        "hongbao-ack-aof",
        "hongbao-ack-ledger",
        "hongbao-http",
        "hello-world",
        "memory",
        "history-received@sqlite",
        "history-sent@sqlite",
        "history-entries@sqlite",
        *WEBHOOK_ROWS,
    ):
        assert name in names
    ours = [row for row in data["scenarios"] if row["ours"]]
    assert all(row["status"] in ("ok", "skipped") for row in ours), ours
    for name in ("hongbao", "hongbao-spread"):
        row = next(r for r in data["scenarios"] if r["scenario"] == name)
        assert row["status"] == "ok", row
        assert row["result"]["duplicates"] == 0 and row["result"]["over_issue"] == 0
        assert row["grabs_per_second"] > 0
        assert "redis_cpu_pct" in row["figures"]
    spread = next(r for r in data["scenarios"] if r["scenario"] == "hongbao-spread")
    # spread over 40 packets, a call touches far more packets than the hot storm's 4
    assert spread["figures"]["packets_per_call"] > 4, spread["figures"]
    for mode in ("aof", "ledger"):  # the embedded Valkey has WAITAOF: neither is skipped
        row = next(r for r in data["scenarios"] if r["scenario"] == f"hongbao-ack-{mode}")
        assert row["status"] == "ok" and row["result"]["duplicates"] == 0, row
    for name in ("hello-world", "hongbao-http"):  # loaded in slices, each counted
        row = next(r for r in data["scenarios"] if r["scenario"] == name)
        assert row["status"] == "ok" and row["figures"]["slices_rps"], row
        assert row["result"]["grabs_attempted"] > 0
    for name in WEBHOOK_ROWS:
        row = next(r for r in data["scenarios"] if r["scenario"] == name)
        assert row["status"] == "ok" and row["figures"]["forged"] == 0, row
        assert row["figures"]["events"] == 2_000 and row["figures"]["events_per_second"] > 0
    assert {t["name"] for t in data["targets"]} >= {"hongbao / seed-baseline"}
    assert plot.stat().st_size > 0
    assert "| scenario |" in markdown.read_text()


@pytest.mark.timeout(120)
def test_bench_rounds_report_the_median_of_interleaved_runs(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "--size", "tiny", "--scenarios", "hongbao,memory", "--rounds", "3"]
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["rounds"] == 3 and "--rounds 3" in data["command"]
    rows = {row["scenario"]: row for row in data["scenarios"]}
    assert set(rows) == {"hongbao", "memory"}  # one row per scenario, not per round
    rates = rows["hongbao"]["figures"]["rounds_grabs_per_second"]
    assert len(rates) == 3
    assert rows["hongbao"]["grabs_per_second"] == sorted(rates)[1]
    assert "rounds_grabs_per_second" not in rows["memory"]["figures"]  # no rate to pick by


def test_bench_rounds_must_be_positive() -> None:
    result = CliRunner().invoke(app, ["bench", "--rounds", "0"])
    assert result.exit_code == 2 and "--rounds" in result.output


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HONGBAO_")}
    env["HONGBAO_SECRET"] = "s" * 64
    run = [sys.executable, "-c", code]
    return subprocess.run(run, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_bench_help_shows_the_bench_options() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    assert "bench [OPTIONS]" in result.output
    for option in ("--quick", "--size", "--scenarios", "--rounds", "--plot", "--redis-url"):
        assert option in result.output


def test_the_service_commands_do_not_load_the_bench() -> None:
    done = _python(
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from hongbao.cli import app\n"
        "assert CliRunner().invoke(app, ['--help']).exit_code == 0\n"
        "assert CliRunner().invoke(app, ['token', 'alice']).exit_code == 0\n"
        "assert 'hongbao_bench' not in sys.modules, 'hongbao_bench was imported'\n"
    )
    assert done.returncode == 0, done.stderr


def test_without_the_bench_package_hongbao_bench_says_how_to_install_it() -> None:
    done = _python(
        "import sys\n"
        "sys.modules['hongbao_bench'] = None  # import hongbao_bench now fails\n"
        "sys.argv = ['hongbao', 'bench', '--quick']\n"
        "from hongbao.cli import main\n"
        "main()\n"
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert "pip install 'hongbao[bench]'" in lines[0]


def test_plot_without_matplotlib_says_how_to_install_it_before_the_run(tmp_path: Path) -> None:
    plot = str(tmp_path / "bench.png")
    done = _python(
        "import sys\n"
        "sys.modules['matplotlib'] = None  # import matplotlib now fails\n"
        f"sys.argv = ['hongbao', 'bench', '--size', 'tiny', '--plot', {plot!r}]\n"
        "from hongbao.cli import main\n"
        "main()\n"
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --plot needs matplotlib"), lines
    assert "pip install 'hongbao[bench]'" in lines[0]
    assert not Path(plot).exists()
