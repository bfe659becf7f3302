"""The `webhooks` scenario's receiver, in a process of its own so that its work is not
counted against the dispatcher's: ``python -m hongbao_bench.webhook_receiver PORT SECRET``
serves a Starlette app on loopback (uvicorn) and prints "ready" once it listens.

``POST /hook`` checks the message's signature with `standardwebhooks` (400 if it does not
verify) and keeps the first arrival of each event id (each event of a batch message):
(arrival, commit) as unix seconds, the commit being the event's ``timestamp``.
``GET /arrivals`` answers ``{"arrivals": [[arrival, commit], ...], "forged": n}``;
``GET /count`` the number only.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import datetime

import uvicorn
from standardwebhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class Arrivals:
    def __init__(self, secret: str) -> None:
        self.webhook = Webhook(secret)
        self.first: dict[str, tuple[float, float]] = {}
        self.forged = 0

    async def hook(self, request: Request) -> Response:
        body = await request.body()
        try:
            message = self.webhook.verify(body, dict(request.headers))
        except WebhookVerificationError:
            self.forged += 1
            return Response(status_code=400)
        arrived = time.time()
        # a batch message carries its events' own bodies
        for event in message["data"]["events"] if message["type"] == "batch" else [message]:
            committed = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
            self.first.setdefault(event["id"], (arrived, committed.timestamp()))
        return Response(status_code=204)

    async def arrivals(self, request: Request) -> Response:
        return JSONResponse({"arrivals": list(self.first.values()), "forged": self.forged})

    async def count(self, request: Request) -> Response:
        return JSONResponse({"count": len(self.first), "forged": self.forged})


def app_for(secret: str) -> Starlette:
    got = Arrivals(secret)
    return Starlette(
        routes=[
            Route("/hook", got.hook, methods=["POST"]),
            Route("/arrivals", got.arrivals),
            Route("/count", got.count),
        ]
    )


async def serve(port: int, secret: str) -> None:
    config = uvicorn.Config(
        app_for(secret),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        access_log=False,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():  # noqa: ASYNC110 (uvicorn has no event)
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await serving


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), sys.argv[2]))
