"""`hongbao bench --size`: a number scales every scenario's work, hongbao-spread's too."""

from __future__ import annotations

import pytest

from hongbao_bench.profiles import PROFILES, profile_for


def test_named_profiles_are_returned_as_they_are() -> None:
    assert profile_for(None, False) == PROFILES["full"]
    assert profile_for(None, True) == PROFILES["quick"]
    assert profile_for("tiny", False) == PROFILES["tiny"]


@pytest.mark.parametrize("quick", [False, True])
def test_a_number_sets_the_hongbao_grabs_and_scales_the_rest(quick: bool) -> None:
    base = PROFILES["quick" if quick else "full"]
    full_size = base.hb_packets * base.hb_shares
    same = profile_for(str(full_size), quick)
    assert (same.spread_packets, same.spread_shares) == (base.spread_packets, base.spread_shares)
    small = profile_for("1000", quick)
    assert small.hb_packets * small.hb_shares == 1000
    # spread stays spread (one share a packet here) and small: no 1,000 packets to open
    assert (small.spread_packets, small.spread_shares) == (20, 1)
    quarter = profile_for(str(full_size // 4), quick)
    assert quarter.spread_packets == base.spread_packets // 4
    assert quarter.spread_shares == base.spread_shares // 4


@pytest.mark.parametrize("size", ["99", "many", "-5"])
def test_a_bad_size_is_refused_with_a_sentence(size: str) -> None:
    with pytest.raises(ValueError, match="--size"):
        profile_for(size, False)
