"""hongbao-http: `hongbao serve --workers 2` under `wrk`, against hello-world on the same setup.

Both servers run side by side and are loaded in alternating slices (hello, grab, grab,
hello, ...), so that both sides of the ratio see the same spells of a shared machine: on
a shared machine the speed of consecutive seconds can differ by half, and two runs one
after the other measure two different machines (docs/performance.md). Each side's
figures are summed over its slices; p99 is the worst slice's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hongbao.service import Hongbao
from hongbao_bench.common import (
    BenchContext,
    Outcome,
    audit_packets,
    forget_packets,
    free_port,
    problem_note,
    send_packets,
)
from hongbao_bench.harness import stop_process
from hongbao_bench.meters import CpuMeter, tree_cpu_seconds
from hongbao_bench.processes import load_env, mint_tokens
from hongbao_bench.results import ScenarioResult

HTTP_WORKERS = 2
#: at most this many slices a side; a slice lasts at least a second (wrk's -d)
MAX_SLICES = 4
#: requests/s the users (and shares) are sized for; the grab endpoint has reached 28,000
RATE_CEILING = 40_000
#: wrk's counts, summed over slices
_WRK_COUNTS = ("requests", "duration_us", "status_errors", "connect", "read", "write", "timeout")
#: the CPU figures summed over slices, as % of one core
_CPU_KEYS = ("redis_cpu_pct", "python_cpu_pct", "machine_cpu_pct", "other_cpu_pct")


WRK_SCRIPT = r"""
-- hongbao bench: POST grab, one user (bearer token) per request, read from a file
-- of "packet_id token" lines, each padded to the same width so that a slice starts
-- with one seek; args: file, first line, lines (this run's slice), line width
local lines, n, i = {}, 0, 0
local counter = 0
local threads = {}

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local first, count, width = tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
  local file = assert(io.open(args[1], "rb"))
  file:seek("set", first * width)
  for _ = 1, count do
    local line = file:read("*l")
    if not line then break end
    local packet, token = line:match("^(%S+) (%S+)")
    n = n + 1
    lines[n] = wrk.format("POST", "/v1/packets/" .. packet .. "/grab",
      {["Authorization"] = "Bearer " .. token, ["Content-Length"] = "0"})
  end
  file:close()
  i = tid or 0
  io.write("WRKREADY\n")  -- the requests are built: the load starts now
  io.flush()
end

function request()
  i = i + 1
  if i > n then i = 1 end
  return lines[i]
end

"""
#: wrk's summary as one JSON line, which `run_wrk` reads (the end of every bench wrk script)
WRK_DONE = r"""
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"status_errors":%d,"connect":%d,' ..
    '"read":%d,"write":%d,"timeout":%d,"p50_us":%d,"p99_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean))
end
"""


def wait_http(
    port: int,
    proc: subprocess.Popen[bytes],
    path: str,
    log: Path,
    workers: int,
    timeout: float = 90,
) -> None:
    """Wait until every worker has started (uvicorn logs one line each) and `path` answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-500:]
            raise RuntimeError(f"the server exited with {proc.returncode}: {tail}")
        started = log.read_text(errors="replace").count("Application startup complete")
        if started >= workers:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1):
                    return
            except OSError:
                pass
        time.sleep(0.1)
    raise RuntimeError(f"the server on port {port} was not up within {timeout:.0f}s")


@contextlib.contextmanager
def http_server(
    args: list[str], env: dict[str, str], port: int, path: str, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_http(port, proc, path, log, HTTP_WORKERS)
            yield proc
        finally:
            stop_process(proc, 30)


@dataclass(frozen=True)
class _Users:
    """The users file wrk reads: a "packet_id token" line per user, each `width` bytes."""

    path: Path
    width: int

    @classmethod
    def write(cls, path: Path, rows: list[str]) -> _Users:
        width = max(len(row) for row in rows) + 1
        path.write_text("".join(row.ljust(width - 1) + "\n" for row in rows), encoding="ascii")
        return cls(path, width)


def _wrk(
    port: int,
    script: Path,
    users: _Users,
    first: int,
    count: int,
    seconds: float,
    connections: int,
    on_ready: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run wrk; `on_ready` is called once its script has built the requests (reading the
    users file takes wrk a second or more, which is not load)."""
    args = [str(users.path), str(first), str(count), str(users.width)]
    return run_wrk(port, script, args, seconds, connections, on_ready)


def run_wrk(
    port: int,
    script: Path,
    script_args: list[str],
    seconds: float,
    connections: int,
    on_ready: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run wrk (one thread) with a script that prints WRKREADY when its requests are built
    and ends with `WRK_DONE`; its summary, with "rps". `on_ready` is called at WRKREADY."""
    args = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s"]
    args += ["-s", str(script), f"http://127.0.0.1:{port}", "--", *script_args]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(seconds + 120, proc.kill)
    watchdog.start()
    output: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("WRKREADY") and on_ready is not None:
                on_ready()
            output.append(line)
        proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
    for line in output:
        if line.startswith("WRKJSON "):
            data: dict[str, Any] = json.loads(line[len("WRKJSON ") :])
            data["rps"] = data["requests"] / (data["duration_us"] / 1e6)
            return data
    raise RuntimeError(f"wrk failed: {''.join(output)[-300:]}")


def _http_result(name: str, data: dict[str, Any], connections: int) -> ScenarioResult:
    return ScenarioResult(
        name=name,
        backend="http",
        grabs_attempted=int(data["requests"]),
        granted=0,
        turned_away_while_left=0,
        duplicates=0,
        over_issue=0,
        retries_or_conflicts=0,
        seconds=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        extra={"connections": connections, "wrk": data},
    )


@dataclass
class _Side:
    """One server under test: where it listens and what its slices measured."""

    pid: int
    port: int
    next_line: int  # first line of users.txt the next slice sends
    fresh_users: bool  # each slice sends users no slice sent before (the grab endpoint)
    runs: list[dict[str, Any]] = field(default_factory=list)
    cpu: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (seconds, figures)
    server_seconds: float = 0.0
    ran_out: bool = False  # a slice sent more requests than it had fresh users: repeats

    def record(self, data: dict[str, Any], count: int) -> None:
        """Add a slice's wrk figures; it was given `count` users from `next_line` on."""
        self.runs.append(data)
        if self.fresh_users:
            self.next_line += data["requests"]
            self.ran_out = self.ran_out or data["requests"] > count

    def wrk_totals(self) -> dict[str, Any]:
        """wrk's figures over all slices: sums, the median p50, the worst p99."""
        runs = self.runs
        totals: dict[str, Any] = {key: sum(r[key] for r in runs) for key in _WRK_COUNTS}
        totals["p50_us"] = statistics.median(r["p50_us"] for r in runs)
        totals["p99_us"] = max(r["p99_us"] for r in runs)
        requests, seconds = totals["requests"], totals["duration_us"] / 1e6
        totals["mean_us"] = sum(r["mean_us"] * r["requests"] for r in runs) / max(1, requests)
        totals["rps"] = requests / seconds if seconds else 0.0
        return totals

    def slice_rates(self) -> list[int]:
        """Requests per second of each slice, in the order they ran."""
        return [round(r["rps"]) for r in self.runs]

    def cpu_figures(self) -> dict[str, Any]:
        """CPU over all slices: each % weighted by its slice's length, and the server's."""
        length = sum(s for s, _ in self.cpu)
        out: dict[str, Any] = {
            key: round(sum(s * figures[key] for s, figures in self.cpu) / length, 1)
            for key in _CPU_KEYS
            if length and all(key in figures for _, figures in self.cpu)
        }
        totals = self.wrk_totals()
        seconds = totals["duration_us"] / 1e6
        out["server_cpu_pct"] = round(self.server_seconds / seconds * 100, 1) if seconds else 0.0
        out["server_us_per_request"] = round(
            self.server_seconds / max(1, totals["requests"]) * 1e6, 1
        )
        if "other_cpu_pct" in out:  # the bench process is python_cpu_pct; wrk stays in here
            out["other_cpu_pct"] = round(max(0.0, out["other_cpu_pct"] - out["server_cpu_pct"]), 1)
        out.pop("python_cpu_pct", None)
        return out


async def _load(
    ctx: BenchContext, side: _Side, script: Path, users: _Users, count: int, seconds: float
) -> None:
    """One measured slice of wrk against `side`, users from its next line on."""
    admin = ctx.admin()
    started: list[tuple[CpuMeter, float]] = []

    def ready() -> None:
        started.append((CpuMeter(admin), tree_cpu_seconds(side.pid)))

    try:
        conns = ctx.profile.http_connections
        data = await asyncio.to_thread(
            _wrk, side.port, script, users, side.next_line, count, seconds, conns, ready
        )
        if not started:
            raise RuntimeError("wrk ran without building its requests")
        meter, served0 = started[0]
        seconds_run = data["duration_us"] / 1e6
        side.cpu.append((seconds_run, meter.stop(seconds_run)))
        side.server_seconds += tree_cpu_seconds(side.pid) - served0
    finally:
        admin.close()
    side.record(data, count)


async def hongbao_http(ctx: BenchContext) -> list[Outcome]:
    if shutil.which("wrk") is None:
        note = "wrk not found (apt-get install -y wrk)"
        return [
            Outcome("hello-world", "hongbao-http", "skipped", note=note),
            Outcome("hongbao-http", "hongbao-http", "skipped", note=note),
        ]
    p = ctx.profile
    work = ctx.work_dir / f"http-{secrets.token_hex(4)}"
    work.mkdir(parents=True)
    secret = secrets.token_hex(32)
    env = load_env(secret)
    # enough distinct users (and shares) for the measured run at a generous rate
    users_needed = int(max(2_000, RATE_CEILING * p.http_seconds))
    warm_users = 2_000
    packets = 8
    per_packet = -(-(users_needed + warm_users) // packets)
    settings = ctx.settings(max_count=per_packet)
    service = await Hongbao.connect(settings, migrate=True)
    try:
        ctx.say(f"opening {packets} packets of {per_packet:,} shares")
        shares = await send_packets(service, packets, per_packet, random.Random(11))
        packet_ids = list(shares)
        users = [f"h{k}" for k in range(1, packets * per_packet + 1)]
        ctx.say(f"{len(users):,} tokens")
        tokens = await mint_tokens(users, env)
        user_file = _Users.write(
            work / "users.txt", [f"{packet_ids[k % packets]} {t}" for k, t in enumerate(tokens)]
        )
        script = work / "grab.lua"
        script.write_text(WRK_SCRIPT + WRK_DONE, encoding="ascii")
        conns, secs = p.http_connections, p.http_seconds
        slices = max(1, min(MAX_SLICES, int(secs)))
        per_slice = RATE_CEILING * max(1, round(secs / slices))
        uvicorn_opts = ["--workers", str(HTTP_WORKERS), "--log-level", "info"]
        # the ceiling: hello world on the same worker processes and uvicorn options
        hello_port, grab_port = free_port(), free_port()
        hello_args = [sys.executable, "-m", "hongbao_bench.hello", str(hello_port)]
        hello_args.append(str(HTTP_WORKERS))
        serve_args = [sys.executable, "-m", "hongbao.cli", "serve", "--port", str(grab_port)]
        serve_args += ["--redis-url", ctx.redis_url, "--database-url", ctx.database_url]
        serve_args += ["--data-dir", str(work / "data"), "--no-persister", *uvicorn_opts]
        ctx.say("hello-world and hongbao serve, 2 workers each: starting")
        with (
            http_server(hello_args, env, hello_port, "/healthz", work / "hello.log") as hello_proc,
            http_server(serve_args, env, grab_port, "/healthz", work / "serve.log") as grab_proc,
        ):
            hello = _Side(hello_proc.pid, hello_port, warm_users, False)
            grab = _Side(grab_proc.pid, grab_port, warm_users, True)
            for side in (hello, grab):  # warm-up: the first requests of each worker
                await asyncio.to_thread(_wrk, side.port, script, user_file, 0, warm_users, 1, conns)
            for k in range(slices):
                ctx.say(
                    f"slice {k + 1}/{slices}: wrk {conns} connections, {secs / slices:.0f}s each"
                )
                for side in (hello, grab) if k % 2 == 0 else (grab, hello):
                    count = max(1, min(warm_users + users_needed - side.next_line, per_slice))
                    await _load(ctx, side, script, user_file, count, secs / slices)
        claims, leftover, problems = await audit_packets(
            service, shares, {u: k for k, u in enumerate(users, start=1)}
        )
        await forget_packets(service, shares)
    finally:
        await service.aclose()
    hello_totals, grab_totals = hello.wrk_totals(), grab.wrk_totals()
    hello_cpu = hello.cpu_figures()
    hello_cpu.pop("redis_cpu_pct", None)
    hello_ok = hello_totals["status_errors"] == 0 and hello_totals["requests"] > 0
    out = [
        Outcome(
            "hello-world",
            "hongbao-http",
            "ok" if hello_ok else "failed",
            _http_result("hello-world", hello_totals, conns),
            "" if hello_ok else f"{hello_totals['status_errors']} non-2xx answers",
            {"rps": round(hello_totals["rps"], 1), **hello_cpu, "slices_rps": hello.slice_rates()},
        )
    ]
    result = _http_result("hongbao-http", grab_totals, conns)
    n_claims = sum(len(v) for v in claims.values())
    all_shares = [a for amounts in shares.values() for a in amounts]
    result.granted = len(claims)
    result.duplicates = sum(1 for v in claims.values() if len(v) > 1)
    result.over_issue = max(0, n_claims - len(all_shares))
    result.conserved = (
        n_claims + leftover[0] == len(all_shares)
        and sum(a for v in claims.values() for a in v) + leftover[1] == sum(all_shares)
        and not problems
    )
    if grab_totals["status_errors"]:
        problems.append(f"{grab_totals['status_errors']} non-2xx answers")
    if grab.ran_out:
        problems.append("more requests than users: some were repeats")
    result.extra.update(claims=n_claims, shares=len(all_shares))
    hello_rps = hello_totals["rps"]
    figures: dict[str, Any] = {
        "rps": round(grab_totals["rps"], 1),
        **grab.cpu_figures(),
        "slices_rps": grab.slice_rates(),
        "of_hello_world_pct": round(100 * grab_totals["rps"] / hello_rps, 1) if hello_rps else 0,
    }
    ok = result.ok and grab_totals["status_errors"] == 0
    note = "; ".join([*problems, problem_note(result)]).strip("; ")
    out.append(
        Outcome("hongbao-http", "hongbao-http", "ok" if ok else "failed", result, note, figures)
    )
    return out
