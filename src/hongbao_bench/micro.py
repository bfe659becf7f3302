"""micro: what each performance seam of the grab path saves, against the plain way.

Every seam the code keeps for speed is measured here beside what it replaces, in the
same process and run, as CPU nanoseconds per operation (the best of several repeats,
so a busy neighbour inflates both sides alike):

* ``grab-tally``: `hongbao.metrics.GrabTally.record` against prometheus-client's
  ``Counter.inc`` + ``Histogram.observe`` (a lock each), once a grab request;
* ``pack-command``: `hongbao.storage.connections.pack_command` against redis-py's
  ``Connection.pack_command``, for a grab call of 8 packets x 4 grabs, once a call;
* ``kept-connections``: `hongbao.storage.connections.KeptConnections.call` against
  ``Redis.execute_command`` through the pool, an EVALSHA round trip, once a call;
* ``fast-path-answer``: the grab fast path's two ASGI messages against a Starlette
  ``Response`` object sent through the same ``send``, once a granted grab;
* ``status-constant``: a GrabStatus member held in a module constant against
  ``GrabStatus.GRANTED``, twice a grab;
* ``user-id-check``: `hongbao.domain.ids.require_user_id` against the user-id pattern
  alone, once a grab;
* ``frozen-heap``: one full collection of the garbage collector with hongbao's modules
  loaded, against the same after `hongbao.runtime.settle_heap` froze them (what a full
  collection under load costs the request it lands in).
"""

from __future__ import annotations

import gc
import time
import timeit
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Histogram
from redis.asyncio.connection import Connection
from starlette.responses import Response
from starlette.types import Message, Scope

from hongbao.domain.ids import require_user_id, valid_user_id
from hongbao.domain.models import GrabStatus
from hongbao.metrics import GrabTally
from hongbao.storage.connections import KeptConnections, pack_command
from hongbao_bench.common import BenchContext, Outcome

#: operations per timing of the in-process seams, and repeats (the best is kept)
OPERATIONS = 20_000
REPEATS = 5
#: round trips per timing of the connection seam
ROUND_TRIPS = 2_000
#: the grab call `pack-command` packs: 8 packets, 4 users each
PACKETS, USERS = 8, 4


async def micro(ctx: BenchContext) -> list[Outcome]:
    rows = [
        _row("grab-tally", *_tally()),
        _row("pack-command", *_packing()),
        _row("kept-connections", *await _connections(ctx.redis_url)),
        _row("fast-path-answer", *await _answers()),
        _row("status-constant", *_status_lookups()),
        _row("user-id-check", *_user_id_checks()),
        _row("frozen-heap", *_collections()),
    ]
    return rows


def _row(name: str, kept_ns: float, plain_ns: float) -> Outcome:
    return Outcome(
        f"micro-{name}",
        "micro",
        "ok",
        note=f"{plain_ns - kept_ns:,.0f} ns saved an operation",
        figures={
            "kept_ns": round(kept_ns, 1),
            "plain_ns": round(plain_ns, 1),
            "saved_ns": round(plain_ns - kept_ns, 1),
        },
    )


def _best_ns(operation: Callable[[], object], number: int = OPERATIONS) -> float:
    """CPU nanoseconds per call of `operation`, the best of `REPEATS` timings."""
    timer = timeit.Timer(operation, timer=time.process_time)
    return min(timer.repeat(REPEATS, number)) / number * 1e9


def _tally() -> tuple[float, float]:
    tally = GrabTally(None)
    registry = CollectorRegistry()
    granted = Counter("grabs", "grabs", ["outcome"], registry=registry).labels("granted")
    latency = Histogram("grab_seconds", "latency", registry=registry)

    def plain() -> None:
        granted.inc()
        latency.observe(0.002)

    return _best_ns(lambda: tally.record("granted", 0.002)), _best_ns(plain)


def _grab_call() -> list[Any]:
    keys = [
        f"hb:{{b{p}}}:p:01m8b1arcbyjk5d7xdpbhgcv{p:02d}:{part}"
        for p in range(PACKETS)
        for part in ("ev", "m", "s", "c")
    ]
    args = [
        x
        for p in range(PACKETS)
        for x in (f"01m8b1arcbyjk5d7xdpbhgcv{p:02d}", " ".join(f"u{p}-{u}" for u in range(USERS)))
    ]
    return ["EVALSHA", "0" * 40, len(keys), *keys, *args]


def _packing() -> tuple[float, float]:
    command = _grab_call()
    conn = Connection()
    number = OPERATIONS // 10
    return (
        _best_ns(lambda: pack_command(*command), number),
        _best_ns(lambda: conn.pack_command(*command), number),
    )


async def _connections(redis_url: str) -> tuple[float, float]:
    """CPU per EVALSHA round trip: on a kept connection, and through redis-py's pool."""
    client = aioredis.Redis.from_url(redis_url)
    kept = KeptConnections(client.connection_pool)
    try:
        sha = await client.script_load("return 1")

        async def kept_call() -> None:
            await kept.call("EVALSHA", sha, 0)

        async def pooled_call() -> None:
            await client.execute_command("EVALSHA", sha, 0)  # type: ignore[no-untyped-call]

        best: dict[str, float] = {}
        for _ in range(REPEATS):  # alternating, so both see the same spells of the machine
            for name, call in (("kept", kept_call), ("pooled", pooled_call)):
                started = time.process_time()
                for _ in range(ROUND_TRIPS):
                    await call()
                spent = (time.process_time() - started) / ROUND_TRIPS * 1e9
                best[name] = min(best.get(name, spent), spent)
    finally:
        await kept.aclose()
        await client.aclose()
    return best["kept"], best["pooled"]


async def _answers() -> tuple[float, float]:
    """A granted grab's 200: the fast path's two messages, or a Response object."""
    body = b'{"packet_id":"01m8b1arcbyjk5d7xdpbhgcv9w","user_id":"bob","amount":649,"seq":1}'
    scope: Scope = {"type": "http", "method": "POST", "path": "/"}

    async def receive() -> Message:
        return {"type": "http.request"}

    async def send(message: Message) -> None:
        return None

    async def fast() -> None:
        headers = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def routed() -> None:
        await Response(body, media_type="application/json")(scope, receive, send)

    def timed(answer: Callable[[], Any]) -> Callable[[], object]:
        def one() -> object:
            coroutine = answer()
            try:
                coroutine.send(None)  # runs to the end: nothing in it waits
            except StopIteration:
                return None
            raise AssertionError("an answer waited")

        return one

    return _best_ns(timed(fast)), _best_ns(timed(routed))


def _status_lookups() -> tuple[float, float]:
    granted = GrabStatus.GRANTED
    return _best_ns(lambda: granted), _best_ns(lambda: GrabStatus.GRANTED)


def _user_id_checks() -> tuple[float, float]:
    def pattern_only() -> object:
        if not valid_user_id("user12345"):
            raise AssertionError("a valid id")
        return "user12345"

    return _best_ns(lambda: require_user_id("user12345")), _best_ns(pattern_only)


def _collections() -> tuple[float, float]:
    """A full collection's CPU with the start-up heap in sight, then with it frozen."""
    import hongbao.app  # noqa: F401  (everything a serve worker loads)

    def full() -> None:
        gc.collect()

    unfrozen = _best_ns(full, 3)
    gc.freeze()  # as settle_heap does at start-up
    try:
        frozen = _best_ns(full, 3)
    finally:
        gc.unfreeze()
    return frozen, unfrozen
