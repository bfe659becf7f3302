"""`hongbao bench --rounds N`: every scenario N times, one row each at its median.

A shared machine's speed drifts by tens of percent from one minute to the next, so one
run of a scenario says as much about the neighbours as about the code. The rounds are
interleaved (all scenarios, then all again), so a slow minute hits every scenario
rather than one; each row then shows the round whose rate is the median, with every
round's rate beside it. A round that failed is never hidden: if any round of a
scenario failed, that failure is the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hongbao.bench.scenarios import Outcome


def combine(rounds: Sequence[Sequence[Outcome]]) -> list[Outcome]:
    """One outcome per scenario row, in the first round's order."""
    if len(rounds) == 1:
        return list(rounds[0])
    by_name: dict[str, list[Outcome]] = {}
    for outcomes in rounds:
        for outcome in outcomes:
            by_name.setdefault(outcome.scenario, []).append(outcome)
    return [_median_row(runs) for runs in by_name.values()]


def _median_row(runs: list[Outcome]) -> Outcome:
    bad = [o for o in runs if o.status in ("failed", "error")]
    rated = sorted(
        (o for o in runs if o.grabs_per_second is not None), key=lambda o: o.grabs_per_second or 0
    )
    if bad:
        chosen = bad[0]
    elif rated:
        chosen = rated[(len(rated) - 1) // 2]  # the lower median for an even count
    else:
        chosen = runs[0]
    figures = dict(chosen.figures)
    rates = [o.grabs_per_second for o in runs]
    if any(rate is not None for rate in rates):
        figures["rounds_grabs_per_second"] = [round(r, 1) if r is not None else None for r in rates]
    return replace(chosen, figures=figures)
