"""``python -m hongbao_bench.peers_runner RUN_PEERS_PY [ARGS]``: the peers' runner, with the
CPU of each grab round read process by process.

run_peers.py (outside this package) measures each server with a ``wrk`` round of grabs
and one of its trivial endpoint. This module loads it as a module, reads every process's
CPU time around each grab round (Linux /proc; ``wrk``'s own from this process's reaped
children) and adds it to the round's result, divided by the requests answered, before
run_peers.py writes its JSON: ``cpu_us`` = {role: [user µs, system µs] a request}, with the
machine's busy and idle µs a request. What each process is comes from its name:

* ``server``: the server answering HTTP (hongbao's API workers, the Python processes
  `hongbao serve` started; the Go binary; Node.js's processes);
* ``main``: `hongbao serve`'s own process, where the embedded default's persister runs;
* ``valkey``: the Valkey (or Redis) servers;
* ``wrk``: the load generator;
* ``other``: everything else the machine ran meanwhile.

A run_peers.py without the ``wrk`` function this wraps runs as it is, without the figures.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from hongbao_bench.meters import ProcessTimes, machine_seconds, process_times

ROLES = ("server", "main", "valkey", "wrk", "other")
#: process names (/proc/PID/comm, at most 15 characters) and their roles; a Python
#: process started by `hongbao serve` (comm "hongbao") is one of its API workers
ROLE_OF_NAME = {
    "hongbao": "main",
    "peer-go": "server",
    "node": "server",
    "valkey-server": "valkey",
    "redis-server": "valkey",
}

Wrk = Callable[[str, str, Mapping[str, str], int], dict[str, Any]]


class Reading:
    """Every process's CPU, the machine's, and this process's reaped children's (wrk's)."""

    def __init__(self) -> None:
        self.processes = process_times()
        self.machine = machine_seconds()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.children = (usage.ru_utime, usage.ru_stime)


def role_of(name: str, parent_name: str) -> str:
    """The role of a process by its name and its parent's (see `ROLES`)."""
    if name in ROLE_OF_NAME:
        return ROLE_OF_NAME[name]
    return "server" if name.startswith("python") and parent_name == "hongbao" else "other"


def cpu_per_request(
    before: Reading, after: Reading, requests: int, own: frozenset[int] = frozenset()
) -> dict[str, Any]:
    """{role: [user µs, system µs] a request}, and the machine's busy and idle µs a
    request, between two readings around `requests` answers. `own` are the pids of this
    runner and of what started it (`hongbao bench`, whose name is serve's): "other"."""
    used = {role: [0.0, 0.0] for role in ROLES}
    processes = after.processes
    for pid, now in processes.items():
        then = before.processes.get(pid, ProcessTimes(now.name, now.parent, 0.0, 0.0))
        parent = processes.get(now.parent)
        role = used["other" if pid in own else role_of(now.name, parent.name if parent else "")]
        role[0] += now.user - then.user
        role[1] += now.system - then.system
    used["wrk"] = [after.children[0] - before.children[0], after.children[1] - before.children[1]]
    scale = 1e6 / max(requests, 1)
    out: dict[str, Any] = {
        role: [round(user * scale, 1), round(system * scale, 1)]
        for role, (user, system) in used.items()
    }
    if before.machine is not None and after.machine is not None:
        out["machine_busy"] = round((after.machine[0] - before.machine[0]) * scale, 1)
        out["machine_idle"] = round((after.machine[1] - before.machine[1]) * scale, 1)
    return out


def measured(wrk: Wrk, own: frozenset[int] = frozenset()) -> Wrk:
    """run_peers.py's `wrk`, with the CPU of each grab round (a round with a request
    script; the trivial endpoint's rounds have none) added to its result."""

    def run(url: str, script: str, env: Mapping[str, str], secs: int) -> dict[str, Any]:
        if not script:
            return wrk(url, script, env, secs)
        before = Reading()
        result = wrk(url, script, env, secs)
        result["cpu_us"] = cpu_per_request(before, Reading(), int(result["requests"]), own)
        return result

    return run


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_peers", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: python -m hongbao_bench.peers_runner RUN_PEERS_PY [ARGS]")
    path = Path(argv[0])
    module = load(path)
    wrk = getattr(module, "wrk", None)
    if callable(wrk):
        own = frozenset({os.getpid(), os.getppid()})
        module.__dict__["wrk"] = measured(wrk, own)  # the name run_peers.py's rounds call
    else:
        print(f"{path} has no wrk function: the rounds' CPU is not read", file=sys.stderr)
    sys.argv = [str(path), *argv[1:]]
    return int(module.main() or 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
