"""Settings from the environment: every value checked against what it accepts."""

from __future__ import annotations

from dataclasses import fields

import pytest

from hongbao.errors import ConfigurationError
from hongbao.settings import ALLOWED, Settings, settings_table


def test_defaults_are_allowed() -> None:
    Settings().check()
    assert Settings.from_env({}) == Settings()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"HONGBAO_BUCKETS": "0"}, "HONGBAO_BUCKETS must be from 1 to 1024, got 0"),
        ({"HONGBAO_BUCKETS": "1e3"}, "HONGBAO_BUCKETS must be a whole number, got '1e3'"),
        ({"HONGBAO_MAX_SHARE": "abc"}, "HONGBAO_MAX_SHARE must be a whole number, got 'abc'"),
        ({"HONGBAO_MAX_COUNT": "0"}, "HONGBAO_MAX_COUNT must be from 1 to 100000"),
        ({"HONGBAO_MIN_SHARE": "500", "HONGBAO_MAX_SHARE": "10"}, "must not exceed HONGBAO_MAX"),
        ({"HONGBAO_PERSISTER_BLOCK_MS": "0"}, "HONGBAO_PERSISTER_BLOCK_MS must be from 1 to 4000"),
        ({"HONGBAO_SWEEP_INTERVAL": "inf"}, "HONGBAO_SWEEP_INTERVAL must be from 0.05 to 3600"),
        ({"HONGBAO_RATE_LIMIT_IP": "-2"}, "HONGBAO_RATE_LIMIT_IP must be from 0 to 1000000"),
        ({"HONGBAO_ACK_MODE": "fsync"}, "HONGBAO_ACK_MODE must be one of redis, aof, replica, led"),
        ({"HONGBAO_ALLOW_EVICTION": "maybe"}, "HONGBAO_ALLOW_EVICTION must be 1 or 0"),
        ({"HONGBAO_PERSISTER_CONSUMER": "a b"}, "HONGBAO_PERSISTER_CONSUMER must be up to 64"),
        ({"HONGBAO_DEFAULT_EXPIRES_IN": "700000"}, "must not exceed HONGBAO_MAX_EXPIRES_IN"),
        ({"HONGBAO_BUCKETS": "9" * 30}, "HONGBAO_BUCKETS must be from 1 to 1024"),
    ],
)
def test_a_value_outside_its_range_names_the_variable(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^[^\n]+$") as caught:
        Settings.from_env(env)
    assert words in str(caught.value)


def test_values_are_read_and_overrides_win() -> None:
    env = {
        "HONGBAO_BUCKETS": " 8 ",
        "HONGBAO_ACK_MODE": "AOF",
        "HONGBAO_ALLOW_EVICTION": "yes",
        "HONGBAO_MAX_SHARE": "500",
        "HONGBAO_PERSISTER_CONSUMER": "api-1",
    }
    settings = Settings.from_env(env, buckets=4)
    assert settings.buckets == 4 and settings.ack_mode == "aof" and settings.allow_eviction
    assert settings.split_limits.max_share == 500 and settings.persister_consumer == "api-1"
    with pytest.raises(ConfigurationError, match="HONGBAO_BUCKETS"):
        Settings.from_env({}, buckets=0)


def test_every_setting_says_what_it_accepts() -> None:
    """The documentation's table comes from the fields: none may be left out."""
    unchecked = {"redis_url", "database_url", "split_limits", "allow_eviction"}
    for f in fields(Settings):
        assert f.name in unchecked or ALLOWED in f.metadata, f.name
    table = {name: accepts for name, _, accepts in settings_table()}
    assert table["HONGBAO_BUCKETS"] == "from 1 to 1024"
    assert table["HONGBAO_MAX_SHARE"] == "from 1 to 4294967295"
    assert table["HONGBAO_ALLOW_EVICTION"] == "1 or 0"
    assert len(table) == len(fields(Settings)) + 2  # split_limits is three variables
