"""The bench's child processes: tokens minted by `hongbao token`, and worker processes
that report each step of their job as one line on stdout ("ready", "finished", "done")."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Self

#: how long a worker process may take to reach its next step
WORKER_TIMEOUT = 900.0


async def mint_tokens(users: Sequence[str], env: dict[str, str]) -> list[str]:
    """One bearer token (an hour) per user, from `hongbao token` run with `env`."""
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "hongbao.cli", "token", "-", "--ttl", "3600"],
        input="\n".join(users),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    tokens = proc.stdout.split()
    if len(tokens) != len(users):
        raise RuntimeError("hongbao token did not print one token per user")
    return tokens


class JobFile:
    """A worker's job, a dataclass handed to its process as a JSON file of its fields."""

    def dump(self, path: Path) -> None:
        fields: dict[str, Any] = asdict(self)  # type: ignore[call-overload]
        path.write_text(json.dumps(fields), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Self:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def load_env(secret: str) -> dict[str, str]:
    """The environment of a `hongbao serve` under the bench's load: this environment
    without its HONGBAO_ settings, the given secret, and the limits off (the load comes
    from one address, and one sender sends every packet)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HONGBAO_")}
    env.update(
        HONGBAO_SECRET=secret,
        HONGBAO_RATE_LIMIT_USER="0",
        HONGBAO_RATE_LIMIT_IP="0",
        HONGBAO_MAX_SENDS_PER_DAY="0",
        HONGBAO_MAX_SENT_PER_DAY="0",
        PYTHONUNBUFFERED="1",
    )
    return env


def log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-600:] if log.exists() else ""


async def expect_line(proc: asyncio.subprocess.Process, word: str, log: Path, who: str) -> None:
    """Wait for the worker `proc` to print `word`; RuntimeError with its log otherwise."""
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), WORKER_TIMEOUT)
    except TimeoutError:
        line = b"(timed out)"
    if line.decode(errors="replace").strip() != word:
        raise RuntimeError(f"{who} said {line[:200]!r}, not {word!r}: {log_tail(log)}")


def worker_main(run_job: Callable[[Path], Coroutine[Any, Any, dict[str, Any]]]) -> None:
    """A worker process's entry: `run_job(job file)`, its result written as JSON to the
    result file (argv 1 and 2), then "done"."""
    from hongbao.console import run_async

    job_file, result_file = Path(sys.argv[1]), Path(sys.argv[2])
    result: dict[str, Any] = run_async(run_job(job_file))
    result_file.write_text(json.dumps(result), encoding="utf-8")
    print("done", flush=True)
