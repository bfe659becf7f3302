"""One client process of the hongbao-cluster scenario: `Hongbao.grab` on given packets.

Run as ``python -m hongbao_bench.cluster_worker JOB.json RESULT.json``. It connects, warms
its connections, prints ``ready``, waits for a line on stdin (the start signal, sent to
every worker at once), grabs, prints ``finished``, writes its answers to RESULT.json and
prints ``done``.
Users are ``cu<n>`` for n in [first_user, first_user + grabs): one grab each.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

from hongbao.runtime import settle_heap
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao_bench.harness import call_shape, engine_storm
from hongbao_bench.processes import JobFile, worker_main


@dataclass(frozen=True)
class Job(JobFile):
    redis_url: str
    database_url: str
    buckets: int
    packets: list[str]
    first_user: int
    grabs: int
    tasks: int


def user_name(n: int) -> str:
    return f"cu{n}"


async def run(job: Job) -> dict[str, Any]:
    settings = Settings.from_env(
        {}, redis_url=job.redis_url, database_url=job.database_url, buckets=job.buckets
    )
    service = await Hongbao.connect(settings)
    try:
        await asyncio.gather(*(service.store.client.ping() for _ in range(64)))
        names = [user_name(job.first_user + k) for k in range(job.grabs)]
        settle_heap()  # as `hongbao serve` does after startup
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        clock = time.perf_counter
        cpu0, t0, began = time.process_time(), clock(), time.time()
        storm = await engine_storm(service, job.packets, names, job.first_user, job.tasks)
        seconds, cpu, ended = clock() - t0, time.process_time() - cpu0, time.time()
        print("finished", flush=True)  # the parent reads the servers' CPU now
        return {
            "answers": storm.answers,
            "seconds": seconds,
            # wall-clock times, comparable between the workers of one run
            "began": began,
            "ended": ended,
            "client_cpu_seconds": cpu,
            "refusals": dict(storm.refusals),
            "failures": len(storm.failures),
            "first_error": storm.failures[0] if storm.failures else None,
            "grabs_per_call": call_shape(service).get("grabs_per_call"),
        }
    finally:
        await service.aclose()


def main() -> None:
    worker_main(lambda job_file: run(Job.load(job_file)))


if __name__ == "__main__":
    main()
