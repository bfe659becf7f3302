"""One client process of the hongbao-cluster scenario: `Hongbao.grab` on given packets.

Run as ``python -m hongbao.bench.cluster_worker JOB.json RESULT.json``. It connects, warms
its connections, prints ``ready``, waits for a line on stdin (the start signal, sent to
every worker at once), grabs, prints ``finished``, writes its answers to RESULT.json and
prints ``done``.
Users are ``cu<n>`` for n in [first_user, first_user + grabs): one grab each.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hongbao.errors import HongbaoError, PacketExhausted, PacketExpired, PacketNotFound
from hongbao.runtime import settle_heap
from hongbao.service import Hongbao
from hongbao.settings import Settings


@dataclass(frozen=True)
class Job:
    redis_url: str
    database_url: str
    buckets: int
    packets: list[str]
    first_user: int
    grabs: int
    tasks: int

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Job:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def user_name(n: int) -> str:
    return f"cu{n}"


async def run(job: Job) -> dict[str, Any]:
    settings = Settings.from_env(
        {}, redis_url=job.redis_url, database_url=job.database_url, buckets=job.buckets
    )
    service = await Hongbao.connect(settings)
    try:
        await asyncio.gather(*(service.store.client.ping() for _ in range(64)))
        settle_heap()  # as `hongbao serve` does after startup
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        answers: list[tuple[int, int | None, float]] = []
        refusals: Counter[str] = Counter()
        failures: list[str] = []
        queue = iter(range(job.grabs))
        clock = time.perf_counter

        async def grabber() -> None:
            for k in queue:
                user = job.first_user + k
                started = clock()
                won: int | None = None
                try:
                    won = (
                        await service.grab(job.packets[k % len(job.packets)], user_name(user))
                    ).amount
                except (PacketExhausted, PacketExpired, PacketNotFound) as exc:
                    refusals[type(exc).__name__] += 1
                except HongbaoError as exc:  # StorageError...: a failure, not a refusal
                    refusals[type(exc).__name__] += 1
                    failures.append(f"{type(exc).__name__}: {exc}")
                answers.append((user, won, clock() - started))

        cpu0, t0, began = time.process_time(), clock(), time.time()
        await asyncio.gather(*(grabber() for _ in range(job.tasks)))
        seconds, cpu, ended = clock() - t0, time.process_time() - cpu0, time.time()
        print("finished", flush=True)  # the parent reads the servers' CPU now
        coalescer = service.coalescer
        return {
            "answers": answers,
            "seconds": seconds,
            # wall-clock times, comparable between the workers of one run
            "began": began,
            "ended": ended,
            "client_cpu_seconds": cpu,
            "refusals": dict(refusals),
            "failures": len(failures),
            "first_error": failures[0] if failures else None,
            "grabs_per_call": (
                round(coalescer.grabs / coalescer.calls, 1)
                if coalescer is not None and coalescer.calls
                else None
            ),
        }
    finally:
        await service.aclose()


def main() -> None:
    job_file, result_file = Path(sys.argv[1]), Path(sys.argv[2])
    from hongbao.cli import run_async

    result = run_async(run(Job.load(job_file)))
    result_file.write_text(json.dumps(result), encoding="utf-8")
    print("done", flush=True)


if __name__ == "__main__":
    main()
