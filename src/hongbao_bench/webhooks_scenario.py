"""Webhooks: a storm's claim.settled events delivered to a local receiver.

Ten packets of 200 shares are grabbed at once with the persister and a webhook
dispatcher running in this process; a receiver on a loopback port (uvicorn, in this
event loop) checks each message's signature with `standardwebhooks` and notes when it
arrived. Reported: events per second from the storm's start to the last arrival, and
the lag from each event's commit (its ``timestamp``) to its arrival, p50 and p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import replace
from datetime import datetime

import uvicorn
from standardwebhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.webhooks import Dispatcher
from hongbao_bench.common import BenchContext, Outcome, forget_packets, free_port, send_packets

PACKETS, SHARES = 10, 200
#: longest wait for the last event, seconds
DEADLINE = 120.0


class _Receiver:
    """Keeps the first arrival of each event: (arrival, commit) times, unix seconds."""

    def __init__(self, expected: int) -> None:
        self.webhook: Webhook | None = None
        self.arrivals: dict[str, tuple[float, float]] = {}
        self.forged = 0
        self.expected = expected
        self.all_in = asyncio.Event()

    async def hook(self, request: Request) -> Response:
        body = await request.body()
        assert self.webhook is not None
        try:
            message = self.webhook.verify(body, dict(request.headers))
        except WebhookVerificationError:
            self.forged += 1
            return Response(status_code=400)
        committed = datetime.fromisoformat(message["timestamp"].replace("Z", "+00:00"))
        self.arrivals.setdefault(message["id"], (time.time(), committed.timestamp()))
        if len(self.arrivals) >= self.expected:
            self.all_in.set()
        return Response(status_code=204)


async def webhooks_scenario(ctx: BenchContext) -> list[Outcome]:
    settings = replace(ctx.settings(), webhook_poll_interval=0.02)
    service = await Hongbao.connect(settings, migrate=True)
    expected = PACKETS * SHARES
    receiver = _Receiver(expected)
    port = free_port()
    app = Starlette(routes=[Route("/hook", receiver.hook, methods=["POST"])])
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", access_log=False
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    stop = asyncio.Event()
    workers: list[asyncio.Task[None]] = []
    endpoint_id = None
    try:
        while not server.started:  # noqa: ASYNC110 (uvicorn offers no event for it)
            await asyncio.sleep(0.01)
        endpoint = await service.webhooks.create(f"http://127.0.0.1:{port}/hook", ["claim.settled"])
        endpoint_id = endpoint.id
        receiver.webhook = Webhook(endpoint.secret)
        persister = Persister(service.store, service.ledger, settings, consumer="bench-webhooks")
        workers = [
            asyncio.create_task(persister.run(stop)),
            asyncio.create_task(Dispatcher(service.ledger, settings).run(stop)),
        ]
        shares = await send_packets(service, PACKETS, SHARES, random.Random(29))
        ctx.say(f"{PACKETS * SHARES:,} grabs over {PACKETS} packets, events to a local receiver")
        started = time.time()
        gate = asyncio.Semaphore(256)

        async def grab(packet_id: str, user: str) -> None:
            async with gate:
                await service.grab(packet_id, user)

        await asyncio.gather(
            *(grab(p, f"w{i}") for p in shares for i in range(SHARES)), return_exceptions=True
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(receiver.all_in.wait(), DEADLINE)
        await forget_packets(service, shares)
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        if endpoint_id is not None:
            with contextlib.suppress(Exception):
                await service.webhooks.delete(endpoint_id)
        server.should_exit = True
        await serving
        await service.aclose()
    got = len(receiver.arrivals)
    lags = sorted(max(0.0, a - c) for a, c in receiver.arrivals.values())
    last = max((a for a, _ in receiver.arrivals.values()), default=started)
    figures = {
        "events": got,
        "events_per_second": round(got / max(last - started, 1e-9), 1),
        "lag_p50_ms": round(_quantile(lags, 0.50) * 1000, 1),
        "lag_p99_ms": round(_quantile(lags, 0.99) * 1000, 1),
        "forged": receiver.forged,
    }
    problems = []
    if got != expected:
        problems.append(f"{got} of {expected} events arrived")
    if receiver.forged:
        problems.append(f"{receiver.forged} messages failed verification")
    status = "failed" if problems else "ok"
    summary = (
        f"{got:,} events at {figures['events_per_second']:,} events/s; commit to arrival "
        f"p50 {figures['lag_p50_ms']:,} ms, p99 {figures['lag_p99_ms']:,} ms"
    )
    note = "; ".join([*problems, summary])
    return [Outcome("webhooks", "webhooks", status, note=note, figures=figures)]


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]
