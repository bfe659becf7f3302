"""Packet rules' pure parts: checks, normal forms, digests; the sender-limit settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from hongbao.domain.rules import (
    MAX_AUDIENCE,
    next_utc_day,
    parse_time,
    passphrase_digest,
    request_digest,
    require_audience,
    require_passphrase,
    require_start,
)
from hongbao.errors import InvalidRequest
from hongbao.rules import grab_digests
from hongbao.settings import Settings

KEY, OTHER = b"k" * 32, b"o" * 32
PID = "01m8b1arcbyjk5d7xdpbhgcv9w"


def test_audience_keeps_order_drops_repeats_and_bounds_count() -> None:
    assert require_audience(["bob", "ann", "bob"], 2) == ("bob", "ann")
    for bad, field in [
        ([], "audience"),
        ("bob", "audience"),
        (["ok", "no way"], "audience"),
        ([f"u{i}" for i in range(MAX_AUDIENCE + 1)], "audience"),
        (["ann", "ann"], "count"),  # one user, two shares
    ]:
        with pytest.raises(InvalidRequest) as refused:
            require_audience(bad, 2)
        assert refused.value.field == field


def test_passphrase_normal_form_and_digests() -> None:
    # NFC: a precomposed é and e + a combining accent are the same passphrase
    assert require_passphrase(" caf\u00e9 ") == require_passphrase("cafe\u0301") == "caf\u00e9"
    for bad in ("", "   ", "x" * 33, "a\nb", "a\u202eb", 7):
        with pytest.raises(InvalidRequest):
            require_passphrase(bad)
    digest = passphrase_digest(KEY, PID, "芝麻开门")
    assert len(digest) == 64 and "芝麻" not in digest
    assert digest == passphrase_digest(KEY, PID, " 芝麻开门 ")
    assert digest != passphrase_digest(KEY, "01m8b1arcbyjk5d7xdpbhgcv9x", "芝麻开门")  # salted
    assert digest != passphrase_digest(OTHER, PID, "芝麻开门")  # keyed
    assert request_digest(KEY, "芝麻开门") != digest
    # a grab sends its digest under each key, the current one first
    sent = grab_digests([KEY, OTHER], PID, "芝麻开门 ")
    assert sent == f"{digest},{passphrase_digest(OTHER, PID, '芝麻开门')}"
    assert grab_digests([KEY], PID, "  ") is None and grab_digests([KEY], PID, None) is None
    with pytest.raises(InvalidRequest):
        grab_digests([KEY], PID, 42)


def test_times() -> None:
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    eight = timezone(timedelta(hours=8))
    assert parse_time("2026-11-26T20:00:00+08:00", "starts_at") == datetime(
        2026, 11, 26, 20, tzinfo=eight
    )
    assert parse_time("2026-11-26T12:00:00.123456789Z", "x").microsecond == 123_456
    noon = datetime(2026, 11, 26, 12, tzinfo=UTC)
    for lower in ("2026-11-26t12:00:00z", "2026-11-26 12:00:00z", "2026-11-26T12:00:00.0z"):
        assert parse_time(lower, "x") == noon  # RFC 3339 allows t and z in lower case
    for bad in ("2026-11-26T20:00:00", "2026-11-26", "2026-02-30T00:00:00Z", "soon"):
        with pytest.raises(InvalidRequest):
            parse_time(bad, "starts_at")
    assert require_start(now - timedelta(seconds=1), now) is None
    assert require_start(now + timedelta(days=7), now) == now + timedelta(days=7)
    with pytest.raises(InvalidRequest):
        require_start(now + timedelta(days=7, seconds=1), now)
    with pytest.raises(InvalidRequest):
        require_start(datetime(2026, 11, 27), now)  # no offset
    assert next_utc_day(now) == datetime(2026, 11, 27, tzinfo=UTC)
    assert next_utc_day(datetime(2026, 11, 27, 1, tzinfo=eight)) == datetime(
        2026, 11, 27, tzinfo=UTC
    )


def test_sender_limit_settings() -> None:
    # the values a peer-comparison tool sets to switch the limits out of its way
    settings = Settings.from_env(
        {"HONGBAO_MAX_SENDS_PER_DAY": "100000000", "HONGBAO_MAX_SENT_PER_DAY": "1000000000000000"}
    )
    assert (settings.max_sends_per_day, settings.max_sent_per_day) == (10**8, 10**15)
    assert Settings.from_env({"HONGBAO_MAX_SENDS_PER_DAY": "0"}).max_sends_per_day == 0
    assert Settings().max_sends_per_day > 0 and Settings().max_sent_per_day > 0  # on
