"""One persister process of the settle scenario's drain rows: `Persister` until the
streams are empty.

Run as ``python -m hongbao_bench.settle_worker JOB.json RESULT.json``. It connects, opens
its Redis and SQL connections, prints ``ready``, waits for a line on stdin (the start
signal, sent to every persister at once), applies batches until no stream entry is
left, prints ``finished``, waits for another line (the parent reads the database
server's CPU meanwhile, while this process's connections are still open), writes what it
did to RESULT.json and prints ``done``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

from hongbao.persister import Persister
from hongbao.runtime import settle_heap
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao_bench.processes import JobFile, worker_main


@dataclass(frozen=True)
class Job(JobFile):
    redis_url: str
    database_url: str
    consumer: str


async def run(job: Job) -> dict[str, Any]:
    settings = Settings.from_env({}, redis_url=job.redis_url, database_url=job.database_url)
    service = await Hongbao.connect(settings)
    try:
        persister = Persister(service.store, service.ledger, settings, consumer=job.consumer)
        await service.store.ensure_groups()
        await service.ledger.balance(job.consumer)  # opens the SQL connection
        settle_heap()  # as `hongbao worker` does after startup
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        cpu0, began = time.process_time(), time.time()
        last_applied = began
        await persister.take_over()
        while True:
            if await persister.step():
                last_applied = time.time()
            elif not await service.store.backlog():
                break
        cpu = time.process_time() - cpu0
        print("finished", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        return {
            # wall-clock times, comparable between the persisters of one run
            "began": began,
            "last_applied": last_applied,
            "cpu_seconds": cpu,
            "applied": persister.stats.applied,
            "batches": persister.stats.batches,
            "dead_lettered": persister.stats.dead_lettered,
        }
    finally:
        await service.aclose()


def main() -> None:
    worker_main(lambda job_file: run(Job.load(job_file)))


if __name__ == "__main__":
    main()
