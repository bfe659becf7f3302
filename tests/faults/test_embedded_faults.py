"""Faults of the one-command `hongbao serve`: its embedded Valkey killed under load.

Run: ``pytest -m faults -s tests/faults/test_embedded_faults.py``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import redis

from hongbao.serving.embedded import ledger_url, socket_url
from tests.api.serving import CLIENT_LIMITS, Serve, clean_env, run_cli, servers_for
from tests.faults.conftest import BUCKETS, SECRET, Load, measure, setup_packets, tokens

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]


def valkey_pid(data_dir: Path, not_this: int | None = None, within: float = 20) -> int:
    """The pid of the embedded server of `data_dir` (a new one, if `not_this` is given)."""
    deadline = time.monotonic() + within
    while True:
        pids = [int(line.split()[0]) for line in servers_for(data_dir)]
        if len(pids) == 1 and pids[0] != not_this:
            return pids[0]
        assert time.monotonic() < deadline, f"no embedded server: {pids}"
        time.sleep(0.02)


def backlog(data_dir: Path) -> int:
    with redis.Redis.from_url(socket_url(data_dir / "redis" / "valkey.sock")) as r:
        return sum(int(r.xlen(f"hb:{{b{b}}}:ev")) for b in range(BUCKETS))


def first_grab_after(url: str, packet_id: str, user: str, within: float) -> float:
    """Seconds until a grab by `user` is answered 200, trying every 20 ms."""
    (token,) = tokens(user)
    started = time.monotonic()
    with httpx.Client(base_url=url, limits=CLIENT_LIMITS, timeout=5) as http:
        while time.monotonic() - started < within:
            try:
                r = http.post(
                    f"/v1/packets/{packet_id}/grab", headers={"Authorization": f"Bearer {token}"}
                )
                if r.status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
    return within


def test_embedded_valkey_killed_under_load(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = clean_env(HONGBAO_SECRET=SECRET, HONGBAO_BUCKETS=str(BUCKETS))
    # aof: a grab is answered once on disk, so a SIGKILL loses no acknowledged grab
    server = Serve(data_dir, None, "--ack", "aof", "--log-level", "warning", env=env)
    with server:
        ids = setup_packets(server.url, 4, 250)
        [probe] = setup_packets(server.url, 1, 10)
        load = Load([server.url], ids, [f"u{i}" for i in range(300)], rate=500).start()
        time.sleep(1.5)
        old = valkey_pid(data_dir)
        os.kill(old, signal.SIGKILL)
        valkey_pid(data_dir, not_this=old)  # restarted: recovering on its private socket
        resumed = first_grab_after(server.url, probe, "probe", within=30)
        result = load.wait()
        deadline = time.monotonic() + 60
        while backlog(data_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        outcome = measure(
            SimpleNamespace(database_url=ledger_url(data_dir)),  # type: ignore[arg-type]
            "7. embedded Valkey kill -9 under serve, --ack aof",
            result,
        )
        print(f"   grabs answered again {resumed:.2f}s after the restart")
        assert resumed < 5, server.log()
        words = " ".join(server.log_path.read_text().split())  # Rich wraps the lines
        assert "restarting it" in words and "is back" in words
        assert outcome.acknowledged > 0
        assert outcome.lost == 0 and outcome.money_difference == 0
        done = run_cli("audit", "--data-dir", str(data_dir), env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert server.stop() == 0


def test_serve_exits_when_its_valkey_cannot_come_back(tmp_path: Path) -> None:
    """A server that fails every restart ends serve with exit 1, so that the service
    manager (systemd, Kubernetes) restarts the whole service."""
    data_dir = tmp_path / "data"
    server = Serve(data_dir, None, "--log-level", "warning")
    with server:
        (manifest,) = (data_dir / "redis" / "appendonlydir").glob("*.manifest")
        manifest.write_text("this is no AOF manifest\n")  # every start now fails
        os.kill(valkey_pid(data_dir), signal.SIGKILL)
        assert server.proc is not None
        code: Any = server.proc.wait(90)
        assert code == 1, server.log()
        assert "could not be kept running" in " ".join(server.log().split())
        assert servers_for(data_dir) == []
