"""Combining interleaved bench rounds: the median row, and failures never hidden."""

from __future__ import annotations

from hongbao_bench.common import Outcome
from hongbao_bench.rounds import combine


def row(name: str, rps: float | None, status: str = "ok") -> Outcome:
    return Outcome(name, name, status, figures={} if rps is None else {"rps": rps})


def test_one_round_is_unchanged() -> None:
    outcomes = [row("a", 1.0), row("b", None)]
    assert combine([outcomes]) == outcomes


def test_the_median_round_is_the_row_with_every_rate_beside_it() -> None:
    rounds = [[row("a", 30.0), row("b", 5.0)], [row("a", 10.0), row("b", 7.0)]]
    rounds.append([row("a", 20.0), row("b", 6.0)])
    a, b = combine(rounds)
    assert (a.scenario, a.grabs_per_second) == ("a", 20.0)
    assert a.figures["rounds_grabs_per_second"] == [30.0, 10.0, 20.0]
    assert (b.scenario, b.grabs_per_second) == ("b", 6.0)


def test_an_even_count_takes_the_lower_median() -> None:
    (a,) = combine([[row("a", 4.0)], [row("a", 2.0)]])
    assert a.grabs_per_second == 2.0


def test_a_failed_round_is_the_row() -> None:
    (a,) = combine([[row("a", 50.0)], [row("a", 1.0, status="failed")], [row("a", 40.0)]])
    assert a.status == "failed" and a.grabs_per_second == 1.0


def http_round(hello: float, grab: float) -> list[Outcome]:
    ratio = round(100 * grab / hello, 1)
    return [
        row("hello-world", hello),
        Outcome(
            "hongbao-http", "hongbao-http", "ok", figures={"rps": grab, "of_hello_world_pct": ratio}
        ),
    ]


def test_a_ratio_pair_comes_from_the_round_of_the_median_ratio() -> None:
    # each row's own median (hello 150, grab 80) would read 53.3%, a pair never measured
    rounds = [http_round(100.0, 80.0), http_round(150.0, 75.0), http_round(200.0, 140.0)]
    hello, grab = combine(rounds)
    assert (hello.grabs_per_second, grab.grabs_per_second) == (200.0, 140.0)  # 70%, the median
    assert grab.figures["rounds_of_hello_world_pct"] == [80.0, 50.0, 70.0]
    assert grab.figures["rounds_shown"] == hello.figures["rounds_shown"] == 3
    assert hello.figures["rounds_grabs_per_second"] == [100.0, 150.0, 200.0]


def test_a_failed_round_of_a_ratio_pair_is_still_the_row() -> None:
    rounds = [http_round(100.0, 80.0), http_round(150.0, 100.0), http_round(200.0, 120.0)]
    rounds[2][1].status = "failed"
    _, grab = combine(rounds)
    assert grab.status == "failed" and grab.grabs_per_second == 120.0
    assert "rounds_shown" not in grab.figures
