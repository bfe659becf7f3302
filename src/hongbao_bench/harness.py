"""One driver for every design: run the grabbers, time each grab, then audit the money.

A design is any object with ``setup(shares) / grab(user_id) / verify() / teardown()``,
all async (`Design`) or all plain functions (`SyncDesign`, driven from a thread pool).
``grab`` returns the amount won, or None when refused; ``verify`` returns the claims
read back from the design's own storage, ``{user_id: [amount, ...]}``. Optional extras
a design may offer, read when present:

* ``leftover() -> (count, amount)`` what its storage still holds unclaimed (enables the
  conservation check claimed + leftover == shares set up);
* ``retries_or_conflicts: int``, ``turned_away: int`` (refusals it knows happened while
  shares were left) and ``stats() -> dict`` (copied into ``extra``).

A design that leaks is reported (``ok`` False), never hidden; a grab that raises counts
as a refusal and as an error.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import random
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

import redis

from hongbao.errors import HongbaoError, PacketExhausted, PacketExpired, PacketNotFound
from hongbao_bench.results import ScenarioResult

if TYPE_CHECKING:
    from hongbao.service import Hongbao

#: one grab: (user id, amount or None, latency in seconds)
Answer = tuple[int, int | None, float]
#: one click to make: (user id, seconds to wait first)
Click = tuple[int, float]


class Design(Protocol):
    name: str
    backend: str

    async def setup(self, shares: list[int]) -> None: ...
    async def grab(self, user_id: int) -> int | None: ...
    async def verify(self) -> dict[int, list[int]]: ...
    async def teardown(self) -> None: ...


class SyncDesign(Protocol):
    name: str
    backend: str

    def setup(self, shares: list[int]) -> None: ...
    def grab(self, user_id: int) -> int | None: ...
    def verify(self) -> dict[int, list[int]]: ...
    def teardown(self) -> None: ...


def seed002_script() -> str:
    """Seed 002's Lua grab script, exactly as published (see lua/seed002_grab.lua)."""
    return (resources.files("hongbao_bench") / "lua" / "seed002_grab.lua").read_text("utf-8")


def percentile_ms(latencies: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of latencies given in seconds, in milliseconds."""
    if not latencies:
        return 0.0
    ordered = sorted(latencies)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1] * 1000.0


async def _call(fn: Any, *args: Any) -> Any:
    """Call a design method, sync (in a thread) or async."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result


def _user_order(grabbers: int, clicks_per_user: int, click_gap_ms: float) -> list[Click]:
    # a user's clicks sit next to each other so they run concurrently (a double click);
    # a repeat click may trail its first by up to click_gap_ms (seeded, reproducible)
    rng = random.Random(grabbers * 1_000 + clicks_per_user)
    return [
        (user, rng.uniform(0.0, click_gap_ms) / 1000.0 if click else 0.0)
        for user in range(1, grabbers + 1)
        for click in range(clicks_per_user)
    ]


class _Errors:
    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None
        self._lock = threading.Lock()

    def add(self, exc: BaseException) -> None:
        with self._lock:
            self.count += 1
            if self.first is None:
                self.first = f"{type(exc).__name__}: {exc}"


async def _grab_async(
    design: Design, order: list[Click], concurrency: int, errors: _Errors
) -> list[Answer]:
    answers: list[Answer] = []
    queue: Iterator[Click] = iter(order)

    async def worker() -> None:
        for user, delay in queue:
            if delay:
                await asyncio.sleep(delay)
            start = time.perf_counter()
            try:
                amount = await design.grab(user)
            except Exception as exc:
                amount = None
                errors.add(exc)
            answers.append((user, amount, time.perf_counter() - start))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers


@dataclass
class Storm:
    """What a storm of `Hongbao.grab` calls got back: grab k was made by user first_id + k."""

    first_id: int = 1
    #: amount won by grab k, None when it was refused or failed
    won: list[int | None] = field(default_factory=list)
    #: seconds grab k took
    took: list[float] = field(default_factory=list)
    #: refusals and failures by exception name
    refusals: Counter[str] = field(default_factory=Counter)
    #: "Name: message" of each failure (StorageError...), which is not a refusal
    failures: list[str] = field(default_factory=list)

    @property
    def answers(self) -> list[Answer]:
        return [
            (self.first_id + k, w, t)
            for k, (w, t) in enumerate(zip(self.won, self.took, strict=True))
        ]


async def engine_storm(
    service: Hongbao,
    packet_ids: Sequence[str],
    names: Sequence[str],
    first_id: int,
    tasks: int,
    passphrase: str | None = None,
) -> Storm:
    """Grab k = 0 .. len(names)-1 by `tasks` concurrent grabbers: user names[k] (id
    first_id + k) grabs packet_ids[k % len(packet_ids)], each grab timed; with
    `passphrase`, every grab sends it.

    Each grab's outcome goes into slot k of lists made beforehand, and `answers` is
    built afterwards: the bench's own bookkeeping adds no tuple and no list growth to
    a grab (that was ~4% of a grab's Python instructions, measured with callgrind)."""
    n, hot = len(names), len(packet_ids)
    storm = Storm(first_id, [None] * n, [0.0] * n)
    won, took = storm.won, storm.took
    queue = iter(range(n))
    clock = time.perf_counter

    async def grabber() -> None:
        grab = service.grab
        for k in queue:
            started = clock()
            try:
                if passphrase is None:
                    won[k] = (await grab(packet_ids[k % hot], names[k])).amount
                else:
                    won[k] = (await grab(packet_ids[k % hot], names[k], None, passphrase)).amount
            except (PacketExhausted, PacketExpired, PacketNotFound) as exc:
                storm.refusals[type(exc).__name__] += 1
            except HongbaoError as exc:  # StorageError...: a failure, not a refusal
                storm.refusals[type(exc).__name__] += 1
                storm.failures.append(f"{type(exc).__name__}: {exc}")
            took[k] = clock() - started

    await asyncio.gather(*(grabber() for _ in range(tasks)))
    return storm


def call_shape(service: Hongbao) -> dict[str, float]:
    """The grabs that rode in each coalesced script call and the packets each touched,
    on average ({} without coalescing)."""
    coalescer = service.coalescer
    if coalescer is None or not coalescer.calls:
        return {}
    return {
        "grabs_per_call": round(coalescer.grabs / coalescer.calls, 1),
        "packets_per_call": round(coalescer.packets / coalescer.calls, 1),
    }


def stop_process(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Ask a child server to stop (SIGTERM); kill it if it is still there after `timeout`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _grab_threads(
    design: SyncDesign, order: list[Click], concurrency: int, errors: _Errors
) -> list[Answer]:
    answers: list[Answer] = []
    queue: Iterator[Click] = iter(order)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                click = next(queue, None)
            if click is None:
                return
            user, delay = click
            if delay:
                time.sleep(delay)
            start = time.perf_counter()
            try:
                amount = design.grab(user)
            except Exception as exc:
                amount = None
                errors.add(exc)
            answers.append((user, amount, time.perf_counter() - start))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


async def run_scenario(
    design: Design | SyncDesign,
    shares: Sequence[int],
    grabbers: int,
    concurrency: int,
    *,
    clicks_per_user: int = 1,
    click_gap_ms: float = 0.0,
    name: str | None = None,
) -> ScenarioResult:
    """Set up `shares`, let `grabbers` users (ids 1..grabbers) grab `clicks_per_user`
    times each through `concurrency` workers, then audit the design's storage.
    A repeat click waits up to `click_gap_ms` (uniform) before it goes: a realistic double
    click, for dedupe checks (the wait is in `seconds`, not in the latencies).
    The design is torn down whatever happens (setup failures included)."""
    if grabbers < 1 or concurrency < 1 or clicks_per_user < 1:
        raise ValueError("grabbers, concurrency and clicks_per_user must be at least 1")
    share_list = list(shares)
    order = _user_order(grabbers, clicks_per_user, click_gap_ms)
    errors = _Errors()
    try:
        await _call(design.setup, share_list)
        started = time.perf_counter()
        if inspect.iscoroutinefunction(design.grab):
            answers = await _grab_async(design, order, concurrency, errors)  # type: ignore[arg-type]
        else:
            answers = await asyncio.to_thread(
                _grab_threads,
                design,  # type: ignore[arg-type]
                order,
                concurrency,
                errors,
            )
        seconds = time.perf_counter() - started
        verify_started = time.perf_counter()
        claims: dict[int, list[int]] = await _call(design.verify)
        verify_seconds = time.perf_counter() - verify_started
        leftover_fn = getattr(design, "leftover", None)
        leftover: tuple[int, int] | None = (
            await _call(leftover_fn) if leftover_fn is not None else None
        )
        stats_fn = getattr(design, "stats", None)
        stats: dict[str, Any] = dict(await _call(stats_fn)) if stats_fn is not None else {}
    finally:
        await _call(design.teardown)
    stats.update(
        users=grabbers,
        clicks_per_user=clicks_per_user,
        click_gap_ms=click_gap_ms,
        concurrency=concurrency,
        verify_seconds=round(verify_seconds, 3),
    )
    return account(
        name=name or design.name,
        backend=design.backend,
        shares=share_list,
        answers=answers,
        seconds=seconds,
        claims=claims,
        leftover=leftover,
        retries_or_conflicts=int(getattr(design, "retries_or_conflicts", 0)),
        design_turned_away=int(getattr(design, "turned_away", 0)),
        errors=errors.count,
        first_error=errors.first,
        extra=stats,
    )


def account(
    *,
    name: str,
    backend: str,
    shares: Sequence[int],
    answers: Sequence[Answer],
    seconds: float,
    claims: dict[int, list[int]],
    leftover: tuple[int, int] | None,
    retries_or_conflicts: int = 0,
    design_turned_away: int = 0,
    errors: int = 0,
    first_error: str | None = None,
    extra: dict[str, Any] | None = None,
) -> ScenarioResult:
    """Audit what grabbers were told against what storage holds."""
    n, total = len(shares), sum(shares)
    claimed = [amount for amounts in claims.values() for amount in amounts]
    claimed_count, claimed_amount = len(claimed), sum(claimed)
    told: dict[int, set[int]] = defaultdict(set)
    refused_users: set[int] = set()
    for user, amount, _ in answers:
        if amount is None:
            refused_users.add(user)
        else:
            told[user].add(amount)
    held = {user: Counter(amounts) for user, amounts in claims.items() if amounts}
    # told they won, but storage has no such claim under their name: money promised, not paid
    lost = sum(1 for user, amounts in told.items() for a in amounts if a not in held.get(user, {}))
    # storage credits a user who was never told they won
    phantom = sum(1 for user in held if user not in told)
    foreign = Counter(claimed) - Counter(shares)
    conserved = lost == 0 and not foreign
    if leftover is not None:
        left_count, left_amount = leftover
        conserved = (
            conserved and claimed_count + left_count == n and claimed_amount + left_amount == total
        )
    refused_empty_handed = len(refused_users - held.keys())
    # shares left at the end were left at every earlier refusal too
    if claimed_count < n:
        turned_away = refused_empty_handed
    else:
        turned_away = min(design_turned_away, refused_empty_handed)
    latencies = [latency for _, _, latency in answers]
    info: dict[str, Any] = {
        "shares": n,
        "total_amount": total,
        "claimed_count": claimed_count,
        "claimed_amount": claimed_amount,
        "left_count": leftover[0] if leftover is not None else None,
        "left_amount": leftover[1] if leftover is not None else None,
        "lost_grants": lost,
        "phantom_claims": phantom,
        "foreign_amounts": sum(foreign.values()),
        "refused_grabs": sum(1 for _, amount, _ in answers if amount is None),
    }
    if first_error is not None:
        info["first_error"] = first_error
    info.update(extra or {})
    return ScenarioResult(
        name=name,
        backend=backend,
        grabs_attempted=len(answers),
        granted=len(held),
        turned_away_while_left=turned_away,
        duplicates=sum(1 for counts in held.values() if counts.total() > 1),
        over_issue=max(0, claimed_count - n) + max(0, claimed_amount - total),
        retries_or_conflicts=retries_or_conflicts,
        seconds=seconds,
        p50_ms=percentile_ms(latencies, 0.50),
        p99_ms=percentile_ms(latencies, 0.99),
        extra=info,
        conserved=conserved,
        errors=errors,
    )


# --------------------------------------------------------------------------- seed 002


def _seed_keys(namespace: str) -> tuple[str, str, str]:
    return (
        namespace + "hongBaoList",
        namespace + "hongBaoConsumedList",
        namespace + "hongBaoConsumedMap",
    )


def run_seed_baseline(
    redis_url: str, shares: int = 100_000, threads: int = 20, *, use_evalsha: bool = False
) -> ScenarioResult:
    """Seed 002's TestEval, as written, from Python: `threads` OS threads, each with its own
    sync connection, one EVAL of the seed's script per grab, thread i trying user ids from
    shares//threads*i upwards until a nil reply finds the list empty (LLEN == 0).

    Test data as the seed's generateTestData: JSON {"id": j, "money": j}, j in
    0..shares-1, LPUSHed by `threads` threads (not timed). Differences: keys carry a random
    prefix instead of FLUSHALL; `use_evalsha` sends EVALSHA (the seed loads the script but
    then sends EVAL with the full text every time)."""
    if shares < 1 or threads < 1:
        raise ValueError("shares and threads must be at least 1")
    script = seed002_script()
    namespace = f"hb:bench:seed002:{uuid.uuid4().hex[:12]}:"
    keys = _seed_keys(namespace)
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        _seed_generate(redis_url, keys[0], shares, threads)
        per = shares // threads
        answers: list[Answer] = []
        counters = Counter[str]()
        lock = threading.Lock()
        errors = _Errors()

        def grabber(index: int) -> None:
            client = redis.Redis.from_url(redis_url, decode_responses=True)
            local: list[Answer] = []
            nils = llens = 0
            try:
                sha = client.script_load(script)
                j = per * index
                while True:
                    start = time.perf_counter()
                    if use_evalsha:
                        reply = client.evalsha(sha, 4, *keys, str(j))
                    else:
                        reply = client.eval(script, 4, *keys, str(j))
                    amount = None if reply is None else int(json.loads(reply)["money"])
                    local.append((j, amount, time.perf_counter() - start))
                    j += 1
                    if reply is None:
                        nils += 1
                        llens += 1
                        if client.llen(keys[0]) == 0:
                            break
            except Exception as exc:
                errors.add(exc)
            finally:
                client.close()
                with lock:
                    answers.extend(local)
                    counters.update(nil_replies=nils, llen_calls=llens)

        workers = [threading.Thread(target=grabber, args=(i,), daemon=True) for i in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        seconds = time.perf_counter() - started

        claims: dict[int, list[int]] = defaultdict(list)
        for raw in admin.lrange(keys[1], 0, -1):
            packet = json.loads(raw)
            claims[int(packet["userId"])].append(int(packet["money"]))
        left = [int(json.loads(raw)["money"]) for raw in admin.lrange(keys[0], 0, -1)]
        dedupe_size = int(admin.hlen(keys[2]))
    finally:
        admin.delete(*keys)
        admin.close()
    return account(
        name="seed-baseline",
        backend="redis",
        shares=list(range(shares)),
        answers=answers,
        seconds=seconds,
        claims=dict(claims),
        leftover=(len(left), sum(left)),
        retries_or_conflicts=counters["nil_replies"],
        errors=errors.count,
        first_error=errors.first,
        extra={
            "threads": threads,
            "command": "EVALSHA" if use_evalsha else "EVAL",
            "llen_calls": counters["llen_calls"],
            "dedupe_hash_size": dedupe_size,
        },
    )


def _seed_generate(redis_url: str, list_key: str, shares: int, threads: int) -> None:
    per, rest = divmod(shares, threads)

    errors = _Errors()

    def push(index: int) -> None:
        low = index * per
        high = low + per + (rest if index == threads - 1 else 0)
        client = redis.Redis.from_url(redis_url)
        try:
            pipe = client.pipeline(transaction=False)
            for j in range(low, high):
                pipe.lpush(list_key, json.dumps({"id": j, "money": j}, separators=(",", ":")))
                if len(pipe) >= 1_000:
                    pipe.execute()
            pipe.execute()
        except Exception as exc:
            errors.add(exc)
        finally:
            client.close()

    workers = [threading.Thread(target=push, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors.first is not None:
        raise RuntimeError(f"seed 002 test data generation failed: {errors.first}")
