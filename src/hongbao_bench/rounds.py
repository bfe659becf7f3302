"""`hongbao bench --rounds N`: every scenario N times, one row each at its median.

A shared machine's speed drifts by tens of percent from one minute to the next, so one
run of a scenario says as much about the neighbours as about the code. The rounds are
interleaved (all scenarios, then all again), so a slow minute hits every scenario
rather than one; each row then shows the round whose rate is the median, with every
round's rate beside it. A round that failed is never hidden: if any round of a
scenario failed, that failure is the row.

A row whose target is a ratio to another row of the same round (the grab endpoint to
hello-world, measured in alternating slices) is chosen by the median of that ratio, and
its reference row comes from the same round: two medians from different rounds would
pair a fast minute with a slow one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hongbao_bench.common import Outcome

#: row -> (the row it is a ratio to, the figure holding the ratio in %)
RATIO_ROWS = {"hongbao-http": ("hello-world", "of_hello_world_pct")}


def combine(rounds: Sequence[Sequence[Outcome]]) -> list[Outcome]:
    """One outcome per scenario row, in the first round's order."""
    if len(rounds) == 1:
        return list(rounds[0])
    by_name: dict[str, list[Outcome]] = {}
    for outcomes in rounds:
        for outcome in outcomes:
            by_name.setdefault(outcome.scenario, []).append(outcome)
    paired: dict[str, int] = {}  # row -> the round it is taken from
    for name, (reference, figure) in RATIO_ROWS.items():
        runs, refs = by_name.get(name, []), by_name.get(reference, [])
        ratios = [o.figures.get(figure) for o in runs]
        if runs and len(refs) == len(runs) and None not in ratios:
            order = sorted(range(len(runs)), key=lambda k: ratios[k] or 0.0)
            paired[name] = paired[reference] = order[(len(order) - 1) // 2]
            by_name[name] = [
                replace(o, figures={**o.figures, f"rounds_{figure}": ratios}) for o in runs
            ]
    return [_median_row(runs, paired.get(name)) for name, runs in by_name.items()]


def _median_row(runs: list[Outcome], chosen_round: int | None = None) -> Outcome:
    """The failed round if any, else round `chosen_round`, else the median rate's round."""
    bad = [o for o in runs if o.status in ("failed", "error")]
    rated = sorted(
        (o for o in runs if o.grabs_per_second is not None), key=lambda o: o.grabs_per_second or 0
    )
    if bad:
        chosen = bad[0]
    elif chosen_round is not None:
        chosen = runs[chosen_round]
    elif rated:
        chosen = rated[(len(rated) - 1) // 2]  # the lower median for an even count
    else:
        chosen = runs[0]
    figures = dict(chosen.figures)
    if chosen_round is not None and not bad:
        figures["rounds_shown"] = chosen_round + 1
    rates = [o.grabs_per_second for o in runs]
    if any(rate is not None for rate in rates):
        figures["rounds_grabs_per_second"] = [round(r, 1) if r is not None else None for r in rates]
    return replace(chosen, figures=figures)
