"""Splitting a packet's total into shares. Pure functions; the caller injects the RNG.

Every strategy returns `count` ints that sum to `total`, each within
[limits.min_share, limits.max_share], or raises SplitError before drawing anything.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from hongbao.domain.models import SplitMode
from hongbao.errors import SplitError

#: the largest share a packet can hold, fen: Redis keeps a share's amount in 32 bits
#: (hongbao.storage.codec packs index * 2^32 + amount)
MAX_SHARE_AMOUNT = (1 << 32) - 1


@dataclass(frozen=True, slots=True)
class SplitLimits:
    #: smallest share, fen
    min_share: int = 1
    #: largest share, fen
    max_share: int = 20_000
    #: most shares in one packet
    max_count: int = 10_000

    def __post_init__(self) -> None:
        if not 1 <= self.min_share <= self.max_share:
            raise SplitError("split limits need 1 <= min_share <= max_share")
        if self.max_share > MAX_SHARE_AMOUNT:
            raise SplitError(f"split limits need max_share <= {MAX_SHARE_AMOUNT}")
        if self.max_count < 1:
            raise SplitError("split limits need max_count >= 1")


DEFAULT_LIMITS = SplitLimits()
Strategy = Callable[[int, int, random.Random, SplitLimits], list[int]]


def check_split(total: int, count: int, limits: SplitLimits = DEFAULT_LIMITS) -> None:
    """Raise SplitError (naming the field) when no split of `total` into `count` exists."""
    if count <= 0:
        raise SplitError("count must be at least 1", "count")
    if count > limits.max_count:
        raise SplitError(f"count must be at most {limits.max_count}", "count")
    if total < count * limits.min_share:
        raise SplitError(
            f"total_amount must be at least {count * limits.min_share} fen "
            f"({limits.min_share} per share)",
            "total_amount",
        )
    if total > count * limits.max_share:
        raise SplitError(
            f"total_amount must be at most {count * limits.max_share} fen "
            f"({limits.max_share} per share)",
            "total_amount",
        )


def _feasible_range(rest: int, left: int, limits: SplitLimits) -> tuple[int, int]:
    """Bounds for the next share so that the `left - 1` shares after it stay feasible."""
    low = max(limits.min_share, rest - limits.max_share * (left - 1))
    high = min(limits.max_share, rest - limits.min_share * (left - 1))
    return low, high


def _round_at_random(numerator: int, denominator: int, rng: random.Random) -> int:
    """numerator / denominator rounded down or up at random, exactly right on average."""
    whole, part = divmod(numerator, denominator)
    if part and rng.randrange(denominator) < part:
        whole += 1
    return whole


def double_mean(
    total: int, count: int, rng: random.Random, limits: SplitLimits = DEFAULT_LIMITS
) -> list[int]:
    """Seed 000's 二倍均值: each share is uniform on [min, 2·mean − min].

    The seed draws from [1, 2m], whose mean is m + 0.5 fen: early grabbers win on
    average. Here the interval is centred on the exact mean: when 2·mean − min is
    not an integer the upper end is rounded up or down at random with the right
    odds, so the expected share at every position is exactly total / count.

    When a bound binds (the cap, or a floor needed to keep the later shares under
    the cap) the interval shrinks symmetrically around the mean, to
    [2·mean − high, high] or [low, 2·mean − low]; clamping the draw instead would
    move the expected share away from the mean and favour later grabbers.
    """
    check_split(total, count, limits)
    shares: list[int] = []
    rest = total
    for left in range(count, 1, -1):
        low, high = _feasible_range(rest, left, limits)
        # mean = rest / left, and low <= mean <= high when the request is feasible
        if 2 * rest <= (low + high) * left:  # mean − low <= high − mean
            start, end = low, _round_at_random(2 * rest - low * left, left, rng)
        else:
            start, end = _round_at_random(2 * rest - high * left, left, rng), high
        share = rng.randint(start, end)
        shares.append(share)
        rest -= share
    shares.append(rest)
    return shares


def bounded(
    total: int, count: int, rng: random.Random, limits: SplitLimits = DEFAULT_LIMITS
) -> list[int]:
    """Seed 001's split with a floor and a ceiling per share.

    Each share is drawn uniformly from what keeps the rest feasible, but never above
    twice the remaining mean (seed 001 bounds the maximum "around the average line").
    The draws are shuffled so no grab position is favoured.
    """
    check_split(total, count, limits)
    shares: list[int] = []
    rest = total
    for left in range(count, 1, -1):
        low, high = _feasible_range(rest, left, limits)
        high = max(low, min(high, 2 * rest // left))
        share = rng.randint(low, high)
        shares.append(share)
        rest -= share
    shares.append(rest)
    rng.shuffle(shares)
    return shares


def equal(
    total: int, count: int, rng: random.Random | None = None, limits: SplitLimits = DEFAULT_LIMITS
) -> list[int]:
    """Equal shares; the remainder is one extra fen for the first `total % count` shares."""
    check_split(total, count, limits)
    base, extra = divmod(total, count)
    return [base + 1] * extra + [base] * (count - extra)


def line_cut(
    total: int, count: int, rng: random.Random, limits: SplitLimits = DEFAULT_LIMITS
) -> list[int]:
    """线段切割法: cut the line of spare fen at `count − 1` random points.

    Each share gets the minimum, then the spare money (total − count·min) is cut with
    stars and bars: `count − 1` distinct bars among `spare + count − 1` slots, so
    every composition is possible and equally likely, and no position is favoured.
    Pieces above the cap give their excess to random pieces that still have room.
    """
    check_split(total, count, limits)
    spare = total - count * limits.min_share
    bars = sorted(rng.sample(range(spare + count - 1), count - 1))
    bounds = [-1, *bars, spare + count - 1]
    shares = [limits.min_share + bounds[i + 1] - bounds[i] - 1 for i in range(count)]
    excess = 0
    for i, share in enumerate(shares):
        if share > limits.max_share:
            excess += share - limits.max_share
            shares[i] = limits.max_share
    room = [i for i, share in enumerate(shares) if share < limits.max_share]
    while excess:
        k = rng.randrange(len(room))
        i = room[k]
        give = min(excess, limits.max_share - shares[i], rng.randint(1, excess))
        shares[i] += give
        excess -= give
        if shares[i] == limits.max_share:  # full: drop it from `room` in O(1)
            room[k] = room[-1]
            room.pop()
    return shares


STRATEGIES: dict[str, Strategy] = {
    "double_mean": double_mean,
    "bounded": bounded,
    "equal": equal,
    "line_cut": line_cut,
}
MODE_STRATEGY: dict[SplitMode, str] = {SplitMode.LUCKY: "double_mean", SplitMode.EQUAL: "equal"}


def split(
    strategy: str | SplitMode,
    total: int,
    count: int,
    rng: random.Random,
    limits: SplitLimits = DEFAULT_LIMITS,
) -> list[int]:
    """Split with a named strategy, or with the strategy behind a packet mode."""
    name = (
        MODE_STRATEGY.get(SplitMode(strategy), "") if strategy in ("lucky", "equal") else strategy
    )
    try:
        chosen = STRATEGIES[str(name)]
    except KeyError:
        raise SplitError(f"unknown split strategy {strategy!r}", "mode") from None
    return chosen(total, count, rng, limits)
