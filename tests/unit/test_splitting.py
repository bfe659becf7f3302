"""Tests for hongbao.domain.splitting: invariants, refusals, regressions and fairness."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hongbao.domain.models import SplitMode
from hongbao.domain.splitting import (
    DEFAULT_LIMITS,
    MODE_STRATEGY,
    STRATEGIES,
    SplitLimits,
    Strategy,
    bounded,
    check_split,
    double_mean,
    equal,
    line_cut,
    split,
)
from hongbao.errors import InvalidRequest, SplitError

ALL_STRATEGIES = sorted(STRATEGIES)
RANDOM_STRATEGIES = ["bounded", "double_mean", "line_cut"]
PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
seeds = st.integers(min_value=0, max_value=2**64)


# --------------------------------------------------------------------------- helpers


@st.composite
def feasible_requests(draw: st.DrawFn, max_count: int = 300) -> tuple[SplitLimits, int, int]:
    """(limits, total, count) for which a split exists, limits varied too."""
    min_share = draw(st.integers(1, 50))
    max_share = min_share + draw(st.one_of(st.integers(0, 20), st.integers(0, 20_000)))
    limits = SplitLimits(
        min_share=min_share,
        max_share=max_share,
        max_count=draw(st.integers(1, max_count)),
    )
    count = draw(st.integers(1, limits.max_count))
    lowest, highest = count * limits.min_share, count * limits.max_share
    total = draw(
        st.one_of(
            st.integers(lowest, highest),
            st.integers(lowest, min(highest, lowest + count)),  # little spare money
            st.integers(max(lowest, highest - count), highest),  # nearly every share capped
            st.sampled_from([lowest, highest]),
        )
    )
    return limits, total, count


@st.composite
def impossible_requests(draw: st.DrawFn) -> tuple[SplitLimits, int, int, str]:
    """(limits, total, count, field) for which no split exists, with the field to blame."""
    min_share = draw(st.integers(1, 50))
    limits = SplitLimits(
        min_share=min_share,
        max_share=min_share + draw(st.integers(0, 20_000)),
        max_count=draw(st.integers(1, 300)),
    )
    kind = draw(st.sampled_from(["count_low", "count_high", "total_low", "total_high"]))
    if kind == "count_low":
        return limits, draw(st.integers(-(10**6), 10**9)), draw(st.integers(-1000, 0)), "count"
    if kind == "count_high":
        count = draw(st.integers(limits.max_count + 1, limits.max_count + 1000))
        return limits, draw(st.integers(-(10**6), 10**9)), count, "count"
    count = draw(st.integers(1, limits.max_count))
    if kind == "total_low":
        total = draw(st.integers(-(10**6), count * limits.min_share - 1))
    else:
        total = draw(st.integers(count * limits.max_share + 1, count * limits.max_share + 10**6))
    return limits, total, count, "total_amount"


def assert_valid_split(shares: list[int], total: int, count: int, limits: SplitLimits) -> None:
    assert all(type(share) is int for share in shares)
    assert len(shares) == count
    assert sum(shares) == total
    assert min(shares) >= limits.min_share
    assert max(shares) <= limits.max_share


def position_means(
    strategy: Strategy,
    total: int,
    count: int,
    packets: int,
    seed: int,
    limits: SplitLimits = DEFAULT_LIMITS,
) -> list[float]:
    """Mean share at each grab position over `packets` simulated packets."""
    rng = random.Random(seed)
    sums = [0] * count
    for _ in range(packets):
        sums = [a + b for a, b in zip(sums, strategy(total, count, rng, limits), strict=True)]
    return [s / packets for s in sums]


def naive_double_mean(
    total: int, count: int, rng: random.Random, limits: SplitLimits = DEFAULT_LIMITS
) -> list[int]:
    """The seed's 二倍均值 as it was: uniform on [1, floor(2·mean)], mean about m + 0.5 fen."""
    shares = []
    rest = total
    for left in range(count, 1, -1):
        share = min(rng.randint(1, max(1, 2 * rest // left)), rest - (left - 1))
        shares.append(share)
        rest -= share
    shares.append(rest)
    return shares


def off_by(means: list[float], expected: float) -> float:
    """Largest relative distance of a position mean from `expected`."""
    return max(abs(mean - expected) / expected for mean in means)


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("name", ALL_STRATEGIES)
@PROPERTY_SETTINGS
@given(request=feasible_requests(), seed=seeds)
def test_every_strategy_splits_exactly_within_limits_and_reproducibly(
    name: str, request: tuple[SplitLimits, int, int], seed: int
) -> None:
    limits, total, count = request
    strategy = STRATEGIES[name]
    shares = strategy(total, count, random.Random(seed), limits)
    assert_valid_split(shares, total, count, limits)
    assert strategy(total, count, random.Random(seed), limits) == shares  # same seed, same split


@pytest.mark.parametrize("mode", ["lucky", "equal", SplitMode.LUCKY, SplitMode.EQUAL])
@settings(max_examples=50, deadline=None)
@given(request=feasible_requests(), seed=seeds)
def test_split_by_mode_uses_the_mode_strategy(
    mode: str, request: tuple[SplitLimits, int, int], seed: int
) -> None:
    limits, total, count = request
    shares = split(mode, total, count, random.Random(seed), limits)
    assert_valid_split(shares, total, count, limits)
    direct = STRATEGIES[MODE_STRATEGY[SplitMode(mode)]](total, count, random.Random(seed), limits)
    assert shares == direct


@pytest.mark.parametrize("name", ALL_STRATEGIES)
def test_split_by_strategy_name(name: str) -> None:
    shares = split(name, 10_000, 7, random.Random(3))
    assert shares == STRATEGIES[name](10_000, 7, random.Random(3), DEFAULT_LIMITS)


def test_mode_strategies() -> None:
    assert MODE_STRATEGY == {SplitMode.LUCKY: "double_mean", SplitMode.EQUAL: "equal"}
    assert {
        "double_mean": double_mean,
        "bounded": bounded,
        "equal": equal,
        "line_cut": line_cut,
    } == STRATEGIES


def test_seeded_random_strategies_do_vary() -> None:
    """Guard against a strategy that ignores its RNG and still passes the invariants."""
    for name in RANDOM_STRATEGIES:
        results = {tuple(STRATEGIES[name](10_000, 10, random.Random(seed))) for seed in range(20)}
        assert len(results) > 10, name


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("name", ALL_STRATEGIES)
@PROPERTY_SETTINGS
@given(request=impossible_requests(), seed=seeds)
def test_impossible_requests_refused_before_drawing(
    name: str, request: tuple[SplitLimits, int, int, str], seed: int
) -> None:
    limits, total, count, field = request
    rng = random.Random(seed)
    state = rng.getstate()
    with pytest.raises(SplitError) as raised:
        STRATEGIES[name](total, count, rng, limits)
    assert raised.value.field == field
    assert rng.getstate() == state
    with pytest.raises(SplitError) as raised:
        split(name, total, count, rng, limits)
    assert raised.value.field == field
    assert rng.getstate() == state
    with pytest.raises(SplitError) as raised:
        check_split(total, count, limits)
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("total", "count", "field"),
    [
        (100, 0, "count"),
        (100, -1, "count"),
        (10**9, 10_001, "count"),  # over max_count
        (9, 10, "total_amount"),  # less than one fen each
        (0, 1, "total_amount"),
        (-5, 1, "total_amount"),
        (20_001, 1, "total_amount"),  # over the cap
        (200_001, 10, "total_amount"),
    ],
)
@pytest.mark.parametrize("mode", ["lucky", "equal"])
def test_impossible_requests_with_default_limits(
    total: int, count: int, field: str, mode: str
) -> None:
    rng = random.Random(0)
    state = rng.getstate()
    with pytest.raises(SplitError) as raised:
        split(mode, total, count, rng)
    assert raised.value.field == field
    assert raised.value.code == "invalid_request"
    assert isinstance(raised.value, InvalidRequest)
    assert isinstance(raised.value, ValueError)
    assert rng.getstate() == state


@pytest.mark.parametrize("strategy", ["nope", "", "LUCKY", "Double_Mean"])
def test_unknown_strategy_refused_before_drawing(strategy: str) -> None:
    rng = random.Random(0)
    state = rng.getstate()
    with pytest.raises(SplitError) as raised:
        split(strategy, 100, 2, rng)
    assert raised.value.field == "mode"
    assert rng.getstate() == state


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_share": 0},
        {"min_share": -1},
        {"min_share": 10, "max_share": 9},
        {"max_share": 0},
        {"max_share": (1 << 32)},
        {"max_count": 0},
        {"max_count": -3},
    ],
)
def test_split_limits_refuse_nonsense(kwargs: dict[str, int]) -> None:
    with pytest.raises(SplitError):
        SplitLimits(**kwargs)


def test_default_limits() -> None:
    assert SplitLimits(min_share=1, max_share=20_000, max_count=10_000) == DEFAULT_LIMITS


# --------------------------------------------------------------------------- regressions


@pytest.mark.parametrize("name", ALL_STRATEGIES)
def test_100_fen_into_18_shares_loses_nothing(name: str) -> None:
    """A Go service paid the last claimer -2 fen for this packet."""
    for seed in range(500):
        shares = STRATEGIES[name](100, 18, random.Random(seed), DEFAULT_LIMITS)
        assert len(shares) == 18
        assert sum(shares) == 100
        assert min(shares) >= 1


def test_100_fen_into_18_equal_shares() -> None:
    shares = equal(100, 18)
    assert Counter(shares) == {6: 10, 5: 8}
    assert shares == [6] * 10 + [5] * 8
    assert split("equal", 100, 18, random.Random(0)) == shares


# --------------------------------------------------------------------------- fairness


def test_double_mean_is_fair_at_every_grab_position() -> None:
    """20,000 packets of 10000 fen / 10: every position averages 1000 fen within 1.5%."""
    means = position_means(double_mean, 10_000, 10, packets=20_000, seed=20_240_101)
    assert off_by(means, 1000) < 0.015, means
    assert abs(means[0] - 1000) < 15  # the seed's first-grabber advantage is gone
    assert abs(means[-1] - 1000) < 15


def test_the_seed_first_grabber_bias_is_gone() -> None:
    """With 3 fen a share the seed's +0.5 fen bias is 17%: the check above must catch it."""
    naive = position_means(naive_double_mean, 30, 10, packets=5_000, seed=7)
    assert naive[0] > 3 * 1.1  # the check really tells the two apart
    assert off_by(naive, 3) > 0.015
    fixed = position_means(double_mean, 30, 10, packets=20_000, seed=7)
    assert off_by(fixed, 3) < 0.015, fixed


@pytest.mark.parametrize("name", RANDOM_STRATEGIES)
@pytest.mark.parametrize(
    ("total", "count", "limits"),
    [
        # little spare money: line_cut used to pay the end positions ~12% less
        (30, 10, DEFAULT_LIMITS),
        # the cap binds: double_mean used to pay late grabbers up to ~35% more
        (10_000, 10, SplitLimits(max_share=1_200)),
        (150_000, 10, DEFAULT_LIMITS),
        # a floor above one fen
        (10_000, 10, SplitLimits(min_share=500)),
    ],
)
def test_no_grab_position_is_favoured(
    name: str, total: int, count: int, limits: SplitLimits
) -> None:
    means = position_means(STRATEGIES[name], total, count, packets=5_000, seed=11, limits=limits)
    assert off_by(means, total / count) < 0.03, means


def test_line_cut_draws_every_composition_equally_often() -> None:
    """Stars and bars: 4 fen into 3 shares of at least 1 has 3 compositions, each 1/3."""
    packets = 30_000
    rng = random.Random(5)
    seen = Counter(tuple(line_cut(4, 3, rng)) for _ in range(packets))
    assert set(seen) == {(2, 1, 1), (1, 2, 1), (1, 1, 2)}
    for times in seen.values():
        assert abs(times / packets - 1 / 3) < 0.015, seen


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("name", ALL_STRATEGIES)
@settings(max_examples=100, deadline=None)
@given(min_share=st.integers(1, 100), spread=st.integers(0, 20_000), seed=seeds, data=st.data())
def test_one_share_gets_everything(
    name: str, min_share: int, spread: int, seed: int, data: st.DataObject
) -> None:
    limits = SplitLimits(min_share=min_share, max_share=min_share + spread, max_count=1)
    total = data.draw(st.integers(limits.min_share, limits.max_share))
    assert STRATEGIES[name](total, 1, random.Random(seed), limits) == [total]


EDGE_LIMITS = [
    DEFAULT_LIMITS,
    SplitLimits(min_share=100, max_share=100),
    SplitLimits(min_share=7, max_share=9),
    SplitLimits(min_share=3, max_share=50_000, max_count=50),
]


@pytest.mark.parametrize("name", ALL_STRATEGIES)
@pytest.mark.parametrize("limits", EDGE_LIMITS)
@pytest.mark.parametrize("count", [1, 2, 3, 18, 50])
def test_least_money_gives_everyone_the_minimum(name: str, limits: SplitLimits, count: int) -> None:
    shares = STRATEGIES[name](count * limits.min_share, count, random.Random(count), limits)
    assert shares == [limits.min_share] * count


@pytest.mark.parametrize("name", ALL_STRATEGIES)
@pytest.mark.parametrize("limits", EDGE_LIMITS)
@pytest.mark.parametrize("count", [1, 2, 3, 18, 50])
def test_most_money_gives_everyone_the_cap(name: str, limits: SplitLimits, count: int) -> None:
    shares = STRATEGIES[name](count * limits.max_share, count, random.Random(count), limits)
    assert shares == [limits.max_share] * count


@pytest.mark.parametrize("name", ALL_STRATEGIES)
@pytest.mark.parametrize(
    "total",
    [
        10_000,  # one fen each
        10_001,
        13_579,  # a small total over many shares
        20_000,
        10_000 * 20_000 - 1,  # all but one share capped
        10_000 * 20_000,  # every share capped
    ],
)
def test_largest_count(name: str, total: int) -> None:
    shares = STRATEGIES[name](total, 10_000, random.Random(total), DEFAULT_LIMITS)
    assert_valid_split(shares, total, 10_000, DEFAULT_LIMITS)


@pytest.mark.parametrize("name", ALL_STRATEGIES)
def test_largest_count_one_fen_each(name: str) -> None:
    assert STRATEGIES[name](10_000, 10_000, random.Random(1)) == [1] * 10_000


def test_equal_puts_the_extra_fen_first() -> None:
    assert equal(10, 3) == [4, 3, 3]
    assert equal(11, 3) == [4, 4, 3]
    assert equal(12, 3) == [4, 4, 4]
    assert equal(7, 7) == [1] * 7
    assert equal(40_000, 2) == [20_000, 20_000]


@settings(max_examples=200, deadline=None)
@given(request=feasible_requests())
def test_equal_shares_differ_by_at_most_one_fen(request: tuple[SplitLimits, int, int]) -> None:
    limits, total, count = request
    shares = equal(total, count, None, limits)
    assert_valid_split(shares, total, count, limits)
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)


def test_equal_ignores_the_rng() -> None:
    rng = random.Random(9)
    state = rng.getstate()
    assert equal(1_000, 3, rng) == [334, 333, 333]
    assert rng.getstate() == state
