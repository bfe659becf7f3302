"""`hongbao audit` / `hongbao recover` against the embedded default while `serve` runs."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis

from tests.api.serving import CLIENT_LIMITS, Serve, run_cli, servers_for

pytestmark = [pytest.mark.integration]


def test_audit_and_recover_while_serving_embedded(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Serve(data) as srv:
        admin, sender, alice = (
            *srv.tokens("admin", admin=True),
            *srv.tokens("sender"),
            *srv.tokens("alice"),
        )
        with httpx.Client(base_url=srv.url, limits=CLIENT_LIMITS, timeout=10) as http:
            r = http.post(
                "/v1/wallets/sender/deposits",
                json={"amount": 1000},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert r.status_code == 201, r.text
            r = http.post(
                "/v1/packets",
                json={"total_amount": 500, "count": 5, "mode": "lucky"},
                headers={"Authorization": f"Bearer {sender}"},
            )
            pid = r.json()["id"]
            grab = http.post(
                f"/v1/packets/{pid}/grab", headers={"Authorization": f"Bearer {alice}"}
            ).json()
        clean = run_cli("audit", "--data-dir", str(data))
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "audit: clean" in clean.stdout and "open packets checked: 1" in clean.stdout
        assert len(servers_for(data)) == 1  # the audit used serve's server, started none

        redis.Redis(unix_socket_path=str(data / "redis" / "valkey.sock")).flushall()
        broken = run_cli("audit", "--data-dir", str(data))
        assert broken.returncode == 1
        assert f"packet {pid}" in broken.stdout and "missing from Redis" in broken.stdout

        fixed = run_cli("recover", "--data-dir", str(data))
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "rebuilt 1 packet(s)" in fixed.stdout
        again = run_cli("recover", "--data-dir", str(data))
        assert again.returncode == 0 and "rebuilt 0 packet(s)" in again.stdout
        with httpx.Client(base_url=srv.url, limits=CLIENT_LIMITS, timeout=10) as http:
            repeat = http.post(
                f"/v1/packets/{pid}/grab", headers={"Authorization": f"Bearer {alice}"}
            ).json()
        assert (repeat["seq"], repeat["amount"]) == (grab["seq"], grab["amount"])
    assert servers_for(data) == []
    offline = run_cli("audit", "--data-dir", str(data))  # starts and stops its own server
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert servers_for(data) == []
