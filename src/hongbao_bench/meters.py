"""CPU and memory readers of the bench: Redis (INFO cpu), this process, the machine, a
process tree, every process by name (Linux /proc), and the peak RSS."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any, NamedTuple

from hongbao_bench.cluster import Admin, cpu_by_node


def machine_busy_seconds() -> float | None:
    """CPU seconds all processes of the machine have used (Linux /proc/stat), or None."""
    times = machine_seconds()
    return None if times is None else times[0]


def machine_seconds() -> tuple[float, float] | None:
    """(busy, idle) CPU seconds of the whole machine (Linux /proc/stat), or None; waiting
    for I/O counts as idle."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:8]) - idle) / tick, idle / tick


class CpuMeter:
    """CPU used during a stretch of wall time, in % of one core: Redis (INFO cpu; on a
    cluster the sum over the primaries, and each primary), this Python process, the whole
    machine, and the rest (other processes: the noise)."""

    def __init__(self, client: Admin) -> None:
        self.client = client
        self.nodes0 = cpu_by_node(client)
        self.redis0 = sum(self.nodes0.values())
        self.python0 = time.process_time()
        self.machine0 = machine_busy_seconds()
        self.wall0 = time.perf_counter()

    def stop(self, wall: float | None = None, ops: int = 0) -> dict[str, Any]:
        """Percentages; with `ops`, also CPU microseconds per operation (these do not
        depend on how busy the machine was, unlike the rates)."""
        seconds = wall if wall is not None else time.perf_counter() - self.wall0
        nodes = cpu_by_node(self.client)
        redis_s = sum(nodes.values()) - self.redis0
        python_s = time.process_time() - self.python0
        redis_pct, python_pct = redis_s / seconds * 100, python_s / seconds * 100
        out: dict[str, Any] = {
            "redis_cpu_pct": round(redis_pct, 1),
            "python_cpu_pct": round(python_pct, 1),
        }
        if len(nodes) > 1:
            out["redis_cpu_pct_by_primary"] = {
                name: round((used - self.nodes0.get(name, used)) / seconds * 100, 1)
                for name, used in nodes.items()
            }
        if ops:
            out["redis_us_per_grab"] = round(redis_s / ops * 1e6, 2)
            out["python_us_per_grab"] = round(python_s / ops * 1e6, 2)
        machine = machine_busy_seconds()
        if machine is not None and self.machine0 is not None:
            machine_pct = (machine - self.machine0) / seconds * 100
            out["machine_cpu_pct"] = round(machine_pct, 1)
            out["other_cpu_pct"] = round(max(0.0, machine_pct - redis_pct - python_pct), 1)
        return out


def _pids() -> list[int]:
    """The processes of this machine (Linux /proc)."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _stat(pid: int) -> tuple[str, list[str]]:
    """A process's command name and the fields of /proc/PID/stat after it (the state
    first; user and system ticks at 11 and 12). OSError when the process is gone."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process and its descendants, from /proc (Linux)."""
    total, todo = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        current = todo.pop()
        try:
            _, stat = _stat(current)
            total += (int(stat[11]) + int(stat[12])) / tick
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def peak_rss_mb() -> float:
    """The most memory this process has held (its peak resident set), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def process_cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """CPU seconds (user + system) of one process, its threads included, from /proc (Linux);
    with `reaped`, also those of its children that ended and were waited for. 0.0 when the
    process is gone or /proc cannot be read."""
    try:
        _, stat = _stat(pid)
    except (OSError, ValueError):
        return 0.0
    ticks = int(stat[11]) + int(stat[12])
    if reaped:
        ticks += int(stat[13]) + int(stat[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def pids_named(*names: str) -> list[int]:
    """The processes of this machine whose command name (/proc/PID/comm) is one of `names`."""
    found = []
    for pid in _pids():
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm in names:
            found.append(pid)
    return found


class ProcessTimes(NamedTuple):
    """One process: its command name (/proc/PID/comm), its parent's pid, and the user and
    system time it has used, seconds."""

    name: str
    parent: int
    user: float
    system: float


def process_times() -> dict[int, ProcessTimes]:
    """Every process of the machine that /proc lets this one read, by pid (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, ProcessTimes] = {}
    for pid in _pids():
        try:
            name, stat = _stat(pid)
            user, system = int(stat[11]) / tick, int(stat[12]) / tick
            found[pid] = ProcessTimes(name, int(stat[1]), user, system)
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return found
