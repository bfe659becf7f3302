"""How a persister divides a batch among the transactions it applies at once."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from hongbao.ledger.sql import ClaimEvent, LedgerEvent, RefundEvent
from hongbao.persister import packet_lanes

AT = datetime(2026, 11, 26, tzinfo=UTC)


def claim(packet_id: str, idx: int = 0) -> ClaimEvent:
    return ClaimEvent(packet_id, idx, f"u{idx}", 1, AT)


def test_packets_are_spread_by_their_events() -> None:
    events: list[LedgerEvent] = [
        *(claim("a", i) for i in range(4)),
        claim("b"),
        claim("c"),
        RefundEvent("a", "s", 5, 0, AT),
        claim("d"),
    ]
    # a (5 events) alone; b, c and d (one each) share the other lane
    assert packet_lanes(events, 2) == [[0, 1, 2, 3, 6], [4, 5, 7]]
    assert packet_lanes(events, 1) == [list(range(8))]
    assert packet_lanes(events, 8) == [[0, 1, 2, 3, 6], [4], [5], [7]]
    assert packet_lanes([], 2) == []


@given(st.lists(st.sampled_from("abcdefg"), max_size=60), st.integers(1, 5))
def test_each_packet_in_one_lane_in_stream_order(packets: list[str], count: int) -> None:
    events = [claim(p, i) for i, p in enumerate(packets)]
    parts = packet_lanes(events, count)
    assert len(parts) == min(count, len(set(packets)))
    assert sorted(pos for part in parts for pos in part) == list(range(len(events)))
    for part in parts:
        assert part == sorted(part) and part
        others = [p for other in parts if other is not part for p in other]
        assert not {packets[p] for p in part} & {packets[p] for p in others}
