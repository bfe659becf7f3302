from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hongbao.keys import PacketKeys, bucket_of_key, dead_letter_key, events_key


@given(st.integers(min_value=0, max_value=10_000))
def test_bucket_of_key_reads_back_every_bucket_key(bucket: int) -> None:
    assert bucket_of_key(events_key(bucket)) == bucket
    assert bucket_of_key(dead_letter_key(bucket)) == bucket


def test_bucket_of_key_reads_a_packets_keys() -> None:
    keys = PacketKeys.of("pk-1", 16)
    assert {bucket_of_key(k) for k in (keys.meta, keys.shares, keys.claims)} == {keys.bucket}


@pytest.mark.parametrize("key", ["hb:ev", "hb:{b}:ev", "hb:{bx1}:ev", "hb:{b1:ev", "hb:{1}:ev"])
def test_bucket_of_key_refuses_a_key_without_a_bucket(key: str) -> None:
    with pytest.raises(ValueError, match="names no bucket"):
        bucket_of_key(key)
