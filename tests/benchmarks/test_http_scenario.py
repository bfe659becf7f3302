"""How hongbao-http adds up its alternating slices, and the users file wrk seeks in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hongbao_bench.http_scenario import _Side, _Users


def _run(requests: int, seconds: float, p50: int, p99: int, mean: float) -> dict[str, Any]:
    return {
        "requests": requests,
        "duration_us": int(seconds * 1e6),
        "status_errors": 1,
        "connect": 0,
        "read": 0,
        "write": 0,
        "timeout": 2,
        "p50_us": p50,
        "p99_us": p99,
        "mean_us": mean,
        "rps": requests / seconds,
    }


def test_slices_add_up_to_one_run_with_the_worst_p99() -> None:
    side = _Side(pid=1, port=1, next_line=0, fresh_users=True)
    side.runs += [
        _run(30_000, 3.0, 4_000, 9_000, 4_100.0),
        _run(10_000, 2.0, 5_000, 20_000, 5_300.0),
        _run(20_000, 3.0, 4_500, 8_000, 4_400.0),
    ]
    totals = side.wrk_totals()
    assert totals["requests"] == 60_000 and totals["duration_us"] == 8_000_000
    assert totals["rps"] == pytest.approx(7_500.0)  # not the mean of the slices' rates
    assert totals["status_errors"] == 3 and totals["timeout"] == 6
    assert totals["p50_us"] == 4_500  # the median slice
    assert totals["p99_us"] == 20_000  # the worst slice
    assert totals["mean_us"] == pytest.approx((30 * 4_100 + 10 * 5_300 + 20 * 4_400) / 60)
    assert side.slice_rates() == [10_000, 5_000, 6_667]


def test_cpu_is_weighted_by_slice_length() -> None:
    side = _Side(pid=1, port=1, next_line=0, fresh_users=True)
    side.runs += [_run(30_000, 3.0, 1, 1, 1.0), _run(10_000, 1.0, 1, 1, 1.0)]
    side.cpu += [
        (3.0, {"redis_cpu_pct": 20.0, "python_cpu_pct": 1.0, "machine_cpu_pct": 190.0,
               "other_cpu_pct": 169.0}),
        (1.0, {"redis_cpu_pct": 40.0, "python_cpu_pct": 1.0, "machine_cpu_pct": 170.0,
               "other_cpu_pct": 129.0}),
    ]  # fmt: skip
    side.server_seconds = 5.2
    figures = side.cpu_figures()
    assert figures["redis_cpu_pct"] == 25.0
    assert figures["server_cpu_pct"] == 130.0  # 5.2 s over 4 s of load
    assert figures["server_us_per_request"] == 130.0  # 5.2 s over 40,000 requests
    assert figures["other_cpu_pct"] == 29.0  # 159 % besides Redis and the bench, less the server
    assert figures["machine_cpu_pct"] == 185.0  # reported, as before the slices
    assert "python_cpu_pct" not in figures  # the bench process, not a server


def test_the_grab_side_moves_on_to_fresh_users_and_notices_repeats() -> None:
    grab = _Side(pid=1, port=1, next_line=2_000, fresh_users=True)
    grab.record(_run(30_000, 3.0, 1, 1, 1.0), count=120_000)
    assert grab.next_line == 32_000 and not grab.ran_out
    grab.record(_run(130_000, 3.0, 1, 1, 1.0), count=120_000)  # wrk wrapped round its users
    assert grab.ran_out
    hello = _Side(pid=2, port=2, next_line=2_000, fresh_users=False)
    hello.record(_run(150_000, 3.0, 1, 1, 1.0), count=120_000)  # hello grabs nothing
    assert hello.next_line == 2_000 and not hello.ran_out


def test_users_file_lines_have_one_width_for_seeking(tmp_path: Path) -> None:
    rows = ["p1 short", "p22 a-much-longer-token", "p3 mid-token"]
    users = _Users.write(tmp_path / "users.txt", rows)
    data = (tmp_path / "users.txt").read_bytes()
    assert len(data) == users.width * len(rows)
    for k, row in enumerate(rows):  # what the wrk script reads after seeking to k * width
        line = data[k * users.width : (k + 1) * users.width].decode()
        assert line.endswith("\n") and line.split() == row.split()
