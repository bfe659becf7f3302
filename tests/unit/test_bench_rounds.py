"""Combining interleaved bench rounds: the median row, and failures never hidden."""

from __future__ import annotations

from hongbao.bench.rounds import combine
from hongbao.bench.scenarios import Outcome


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
