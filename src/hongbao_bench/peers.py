"""``peers``: hongbao's HTTP grab path beside the services a team would write instead.

The peers (Go net/http + redigo and Node.js + ioredis, one EVALSHA per grab, no token
check) and their runner ``run_peers.py`` live outside this package, in a peers directory:
``$HONGBAO_PEERS_DIR``, else ``../shared/peers`` beside the checkout. The runner is given
this venv's Python and PATH, so the ``hongbao`` it starts is this one. It runs, in
alternating rounds, ``hongbao serve --workers 2`` on its embedded default, the same as an
API node (``--no-persister`` beside its own Valkey), and each peer, under ``wrk -t2
-c64``, each followed by its own trivial endpoint; this module reports the medians of the
rounds for two shapes: ``spread`` (request k to packet k mod 30) and ``hot`` (to one of
2 packets). It runs the runner through ``hongbao_bench.peers_runner``, which reads each
process's CPU around each grab round: the medians of those, µs a request, show where a
request's CPU goes on each server (``cpu_us_a_request``).

The peers are built once by their ``build.sh`` into ``$PEERS_BUILD`` (default
/tmp/hongbao-peers). Without the directory, ``wrk``, or a successful build, the scenario is
skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hongbao_bench.common import BenchContext, Outcome

PEERS_DIR_ENV = "HONGBAO_PEERS_DIR"
SHAPES = ("spread", "hot")
#: the servers run_peers.py knows, hongbao's first
SERVERS = ("hongbao", "hongbao-np", "go", "node", "node-ap")
PEERS = ("go", "node", "node-ap")
#: the issue's targets: an API node against the best peer, the embedded default likewise
API_NODE_OF_BEST_PEER = 1.25
EMBEDDED_OF_BEST_PEER = 1.0
P99_MS = 20.0
#: the shares run_peers.py gives a hongbao server (30 packets of 10,000): a round that
#: sends more grabs than that ends on refusals once they are gone
HONGBAO_SHARES = 30 * 10_000


def peers_dir() -> Path | None:
    """Where run_peers.py is, or None."""
    given = os.environ.get(PEERS_DIR_ENV)
    checkout = Path(__file__).resolve().parents[2]
    candidate = Path(given) if given else checkout.parent / "shared" / "peers"
    return candidate if (candidate / "run_peers.py").is_file() else None


def build_dir() -> Path:
    return Path(os.environ.get("PEERS_BUILD", "/tmp/hongbao-peers"))


def _built(build: Path) -> bool:
    return (build / "peer-go").is_file() and (build / "node" / "node_modules").is_dir()


def _runner_env() -> dict[str, str]:
    """The environment run_peers.py gets: this venv's scripts first on PATH."""
    scripts = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=scripts + os.pathsep + os.environ.get("PATH", ""))


def why_not_runnable(where: Path | None) -> str | None:
    """Why the scenario cannot run here, or None when it can (after building the peers)."""
    if where is None:
        return (
            f"no peers directory: set {PEERS_DIR_ENV} to the directory holding run_peers.py "
            "(../shared/peers beside the checkout is found by itself)"
        )
    if shutil.which("wrk") is None:
        return "wrk is not installed (./scripts/test installs it)"
    build = build_dir()
    if _built(build):
        return None
    done = subprocess.run(
        ["bash", str(where / "build.sh")],
        env=dict(_runner_env(), PEERS_BUILD=str(build)),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0 or not _built(build):
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"the peers did not build ({where / 'build.sh'}): {last[0]}"
    return None


def run_shape(where: Path, shape: str, rounds: int, seconds: int) -> dict[str, Any]:
    """run_peers.py's rows for one shape: server -> one result per round."""
    with tempfile.TemporaryDirectory(prefix="hb-peers-") as tmp:
        out = Path(tmp) / "rows.json"
        argv = [
            sys.executable,
            "-m",
            "hongbao_bench.peers_runner",
            str(where / "run_peers.py"),
            "--rounds",
            str(rounds),
            "--secs",
            str(seconds),
            "--shape",
            shape,
            "--json",
            str(out),
        ]
        done = subprocess.run(
            argv,
            env=dict(_runner_env(), PEERS_BUILD=str(build_dir())),
            capture_output=True,
            text=True,
            timeout=rounds * len(SERVERS) * (2 * seconds + 240),
            check=False,
        )
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr or done.stdout).strip()[-400:]
            raise RuntimeError(f"run_peers.py --shape {shape} failed: {tail}")
        rows: dict[str, Any] = json.loads(out.read_text())
        return rows


def outcomes_of(shape: str, rows: dict[str, Sequence[dict[str, Any]]]) -> list[Outcome]:
    """One report row per server: medians of its rounds.

    A peer's round is sound when every answer was 2xx and its claims add up. run_peers.py
    checks no claims for hongbao, and gives it `HONGBAO_SHARES` shares: its round is sound
    when its non-2xx answers are exactly its grabs past the shares (every share granted
    first), and its rate is then the granted grabs'. Each of wrk's two threads grabs its
    own half of the packets, so a round that ran past the shares with one thread ahead
    of the other shows more refusals than that and is marked failed though sound: the
    profile's rounds are short enough to stay within the shares."""
    found = []
    for server, runs in rows.items():
        if not runs:
            continue
        grabs = [r["grab"] for r in runs]
        non2xx = sum(int(g["non2xx"]) for g in grabs)
        hongbao = server.startswith("hongbao")
        if hongbao:
            rps = [granted_rate(g) for g in grabs]
            past_shares = sum(refusals_past_shares(g) for g in grabs)
            ok = all(int(g["non2xx"]) == refusals_past_shares(g) for g in grabs)
        else:
            rps = [float(g["rps"]) for g in grabs]
            past_shares = 0
            checked = all(bool(r.get("check", {}).get("ok")) for r in runs)
            ok = non2xx == 0 and checked
        figures: dict[str, Any] = {
            "rps": round(statistics.median(rps), 1),
            "p99_ms": round(statistics.median(float(g["p99_ms"]) for g in grabs), 2),
            "hello_rps": round(statistics.median(float(r["hello"]["rps"]) for r in runs), 1),
            "rounds_grabs_per_second": [round(x, 1) for x in rps],
            "non2xx": non2xx,
            "refused_past_shares": past_shares,
            "machine_busy_pct": statistics.median(float(g["machine_busy_pct"]) for g in grabs),
            "shape": shape,
            "server": server,
        }
        cpu = cpu_medians([g["cpu_us"] for g in grabs if "cpu_us" in g])
        if cpu:
            figures["cpu_us_a_request"] = cpu
        if ok:
            note = f"every share granted, then {past_shares} refusals" if past_shares else ""
        elif hongbao:
            note = f"{non2xx} non-2xx answers, {past_shares} grabs past the shares"
        else:
            note = f"{non2xx} non-2xx answers" + ("" if checked else ", claims off")
        found.append(
            Outcome(
                f"peers-{shape}:{server}", "peers", "ok" if ok else "failed", None, note, figures
            )
        )
    return found


def cpu_medians(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The medians over rounds of each process role's [user, system] µs a request and of
    the machine's busy and idle µs a request (`hongbao_bench.peers_runner`)."""
    if not rounds:
        return {}
    out: dict[str, Any] = {}
    for key, first in rounds[0].items():
        if isinstance(first, list):
            out[key] = [
                round(statistics.median(float(r[key][i]) for r in rounds), 1) for i in (0, 1)
            ]
        else:
            out[key] = round(statistics.median(float(r[key]) for r in rounds), 1)
    return out


def refusals_past_shares(grab: dict[str, Any]) -> int:
    """The refusals a hongbao round ends on: its grabs past `HONGBAO_SHARES`."""
    return max(0, int(grab["requests"]) - HONGBAO_SHARES)


def granted_rate(grab: dict[str, Any]) -> float:
    """A hongbao round's granted grabs a second: wrk's rate less its answers past the
    shares (a lower bound: the refusals at the end come faster than grants)."""
    requests = int(grab["requests"])
    past = refusals_past_shares(grab)
    rate = float(grab["rps"])
    return rate * (requests - past) / requests if requests else rate


def ratios(outcomes: Sequence[Outcome]) -> list[tuple[str, str, float, float]]:
    """(shape, hongbao server, its rate / the best peer's, the goal) for each shape run."""
    found = []
    for shape in SHAPES:
        rates = {
            o.figures["server"]: float(o.figures["rps"])
            for o in outcomes
            if o.group == "peers" and o.figures.get("shape") == shape
        }
        best = max((rates[p] for p in PEERS if p in rates), default=None)
        if not best:
            continue
        for server, goal in (
            ("hongbao-np", API_NODE_OF_BEST_PEER),
            ("hongbao", EMBEDDED_OF_BEST_PEER),
        ):
            if server in rates:
                found.append((shape, server, rates[server] / best, goal))
    return found


async def peers(ctx: BenchContext) -> list[Outcome]:
    where = peers_dir()
    why = await asyncio.to_thread(why_not_runnable, where)
    if why is not None or where is None:
        return [Outcome("peers", "peers", "skipped", note=why or "")]
    p = ctx.profile
    found: list[Outcome] = []
    for shape in SHAPES:
        rows = await asyncio.to_thread(run_shape, where, shape, p.peers_rounds, p.peers_seconds)
        found += outcomes_of(shape, rows)
    return found
