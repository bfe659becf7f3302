"""HONGBAO_WEBHOOK_HOSTS: which hosts an endpoint may name."""

from __future__ import annotations

import pytest

from hongbao.errors import ConfigurationError, InvalidRequest
from hongbao.settings import Settings
from hongbao.webhooks import AllowedHosts, check_url


def test_no_hosts_named_allows_any() -> None:
    hosts = AllowedHosts.parse("")
    assert hosts.allows("10.0.0.1") and hosts.allows_url("http://anything.example/x")


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://hooks.example.com/in", True),
        ("https://HOOKS.example.com./in", True),
        ("https://other.example.com/in", False),
        ("https://a.example.net/in", True),
        ("https://a.b.example.net/in", True),
        ("https://example.net/in", False),
        ("https://evilexample.net/in", False),
        ("http://127.0.0.1:8080/in", True),
        ("http://127.0.0.2/in", False),
        ("http://[::1]:9000/in", True),
        ("http://169.254.169.254/latest", False),
    ],
)
def test_named_hosts_and_subdomains_are_allowed_and_nothing_else(url: str, allowed: bool) -> None:
    hosts = AllowedHosts.parse("hooks.example.com, .example.net,127.0.0.1,[::1]")
    assert hosts.allows_url(url) is allowed
    if allowed:
        assert check_url(url, hosts) == url
    else:
        with pytest.raises(InvalidRequest, match="HONGBAO_WEBHOOK_HOSTS") as refused:
            check_url(url, hosts)
        assert refused.value.field == "url"


def test_the_setting_refuses_what_is_not_a_host_list() -> None:
    assert Settings.from_env({"HONGBAO_WEBHOOK_HOSTS": ".example.com,10.0.0.1"}).webhook_hosts
    with pytest.raises(ConfigurationError, match="HONGBAO_WEBHOOK_HOSTS"):
        Settings.from_env({"HONGBAO_WEBHOOK_HOSTS": "http://example.com/"})
