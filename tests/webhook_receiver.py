"""A real webhook receiver for the tests: a Starlette app served by uvicorn on a loopback
port, in a thread of its own, that checks every message's signature with the
`standardwebhooks` library and keeps what it got (the events of a batch message one by
one).

`answer` sets the status it replies with (200 by default; 410 makes hongbao disable the
endpoint); `stop()` closes the port and `start()` opens the same one again.

A test asks for the receiver before the app or service fixtures, so that it stops after
them: stopping it while the app's dispatcher still holds a connection to it has left the
app's own shutdown hanging.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from standardwebhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.api.serving import free_port


@dataclass(frozen=True)
class Received:
    id: str
    type: str
    data: dict[str, Any]
    timestamp: str
    headers: dict[str, str]
    #: the indexes of `Receiver.secrets` whose key verifies the message
    verified_by: tuple[int, ...]
    #: time.time() when it arrived
    at: float


@dataclass
class Receiver:
    secrets: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    answer: int = 200
    #: the events received, a batch message's one by one
    got: list[Received] = field(default_factory=list)
    #: the verified messages: (webhook id, the number of events carried)
    messages: list[tuple[str, int]] = field(default_factory=list)
    #: messages no secret verified (each a reason)
    refused: list[str] = field(default_factory=list)
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def hook(self, request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        verified = []
        for index, secret in enumerate(self.secrets):
            try:
                Webhook(secret).verify(body, headers)
            except WebhookVerificationError:
                continue
            verified.append(index)
        message = json.loads(body)
        if not verified:
            self.refused.append(f"{message.get('id')}: no secret verifies it")
        elif headers.get("webhook-id") != message["id"]:
            self.refused.append(f"{message['id']}: webhook-id {headers.get('webhook-id')}")
        else:
            # a batch message carries its events' own bodies, in order
            carried = message["data"]["events"] if message["type"] == "batch" else [message]
            self.messages.append((message["id"], len(carried)))
            self.got.extend(
                Received(
                    event["id"],
                    event["type"],
                    event["data"],
                    event["timestamp"],
                    headers,
                    tuple(verified),
                    time.time(),
                )
                for event in carried
            )
        return Response(status_code=self.answer)

    def start(self) -> Receiver:
        app = Starlette(routes=[Route("/hook", self.hook, methods=["POST"])])
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, name="webhook-receiver", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert self._thread.is_alive(), "the receiver could not start"
            assert time.monotonic() < deadline, "the receiver did not start in 10 s"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)
        self._server = self._thread = None

    def of_type(self, event_type: str) -> list[Received]:
        return [r for r in self.got if r.type == event_type]

    def distinct(self, event_type: str | None = None) -> dict[str, Received]:
        """The messages by webhook id (a repeat counts once)."""
        return {r.id: r for r in self.got if event_type is None or r.type == event_type}
