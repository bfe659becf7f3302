"""Schemathesis, driven by /openapi.json, against `hongbao serve` running as a subprocess.

Every check runs except `positive_data_acceptance`: two rules of the contract cannot be
said in JSON Schema, so schema-valid requests may rightly get 422 -- the split bounds
(total_amount between count × min and count × max share) and "floats are refused"
(JSON Schema counts 100.0 as an integer). The live event stream is left out (see
below). A 5xx, an undocumented status or media type, a response body off its schema,
an accepted invalid request or ignored auth all fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.api.serving import Serve, audit, clean_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ST = Path(sys.executable).parent / "st"
MAX_EXAMPLES = 30


def schemathesis(url: str, token: str, seed: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(ST),
            "run",
            f"{url}/openapi.json",
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            # a found packet's event stream stays open for minutes: each such case would
            # wait out the request timeout (tests/web covers the stream)
            "--exclude-operation-id",
            "packetEvents",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            str(seed),
            "--request-timeout",
            "10",
            "--suppress-health-check",
            "all",
        ],
        cwd=cwd,
        env=clean_env(NO_COLOR="1"),
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


@pytest.mark.skipif(not ST.exists() and shutil.which("st") is None, reason="no schemathesis")
def test_schemathesis_finds_nothing(tmp_path: Path) -> None:
    # the endpoints schemathesis registers get the in-process dispatcher's sends: kept on
    # loopback (no name lookups leave the machine, nothing waits on made-up hosts)
    server = Serve(tmp_path / "data", env={"HONGBAO_WEBHOOK_HOSTS": "127.0.0.1"})
    with server:
        [admin] = server.tokens("admin", admin=True)
        [user] = server.tokens("fuzzer")
        for who in ("admin", "fuzzer"):  # money, so that sends can succeed
            r = httpx.post(
                f"{server.url}/v1/wallets/{who}/deposits",
                json={"amount": 10_000_000_000},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert r.status_code == 201, r.text
        for seed, token in ((1, admin), (2, user)):
            done = schemathesis(server.url, token, seed, tmp_path)
            assert done.returncode == 0, done.stdout[-12_000:] + done.stderr[-4000:]
        assert httpx.get(f"{server.url}/readyz").status_code == 200
        assert server.stop() == 0
        log = server.log()
        assert "Traceback" not in log and "Exception" not in log, log
    assert audit(tmp_path / "data") == []
