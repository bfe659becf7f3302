"""uvicorn's HTTP protocol, with `POST /v1/packets/{id}/grab` answered from the parser.

uvicorn turns each request into an ASGI cycle: a scope, a task running the app, and
`http.response.*` messages checked and written one by one. For the one request that
comes in storms that is most of a worker's time. `GrabProtocol` is uvicorn's httptools
protocol in every respect but one: a grab that has no body, arrives over HTTP/1.1 and is
the only request in flight on its connection goes straight from the parser's
`on_headers_complete` to `Api.grab_answer` (the code the routed endpoint and the ASGI fast
path run), and its answer is written to the socket as uvicorn would write it (the
server's default headers, the security headers, `connection: close` when the connection
ends). Every other request, including a grab with a body (a passphrase), a query, an
escaped path, HTTP/1.0 or one pipelined behind another request, takes uvicorn's own path
and the app's `GrabFastPath`.

uvicorn's protocol keeps its state in the current request's cycle (`self.cycle`); a grab
answered here stands in that place as a `_GrabCycle`, so pipelining, keep-alive, the
graceful shutdown and a client that goes away work as for any request. The class relies
on those attributes of uvicorn's `HttpToolsProtocol` (`tests/api/test_grab_protocol.py`
checks each behaviour over a real socket).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.applications import Starlette
from starlette.responses import Response
from uvicorn.config import Config
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from hongbao.api.errors import problem
from hongbao.api.fastpath import GrabHeaders, grab_headers, grab_path_target, granted_headers
from hongbao.api.routes import Api, has_body

log = logging.getLogger("hongbao.api")


class _NoWaiter:
    """The cycle's `message_event`: uvicorn sets it when the connection ends, for an app
    waiting on the request body; a grab answered here reads none."""

    def set(self) -> None:
        return None


class _GrabCycle:
    """The state uvicorn's protocol reads from a request's cycle, for a grab answered here."""

    __slots__ = (
        "body",
        "disconnected",
        "keep_alive",
        "message_event",
        "more_body",
        "response_complete",
    )

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.disconnected = False
        self.response_complete = False
        self.more_body = False
        self.body = bytearray()
        self.message_event = _NoWaiter()


class GrabRoute:
    """What a worker's connections need to answer grabs: the app's `Api` and uvicorn's
    proxy-header middleware, when trusted proxies are configured."""

    def __init__(self, api: Api, proxies: ProxyHeadersMiddleware | None) -> None:
        self.api = api
        self.proxies = proxies

    @classmethod
    def of(cls, app: Any) -> GrabRoute | None:
        """The route of uvicorn's loaded app (the hongbao app under uvicorn's wrappers), or
        None for an app that is not hongbao's."""
        proxies = None
        while not isinstance(app, Starlette):
            if isinstance(app, ProxyHeadersMiddleware):
                proxies = app
            app = getattr(app, "app", None)
            if app is None:
                return None
        api = getattr(app.state, "api", None)
        return cls(api, proxies) if isinstance(api, Api) else None

    def client_host(self, peer: str | None, headers: list[tuple[bytes, bytes]]) -> str | None:
        """The client's address: the peer, or what a trusted proxy says it forwarded for
        (the rule of uvicorn's ProxyHeadersMiddleware, with its list of trusted hosts)."""
        proxies = self.proxies
        if proxies is None or peer not in proxies.trusted_hosts:
            return peer
        forwarded = [value for name, value in headers if name == b"x-forwarded-for"]
        if not forwarded:
            return peer
        host, _ = proxies.trusted_hosts.get_trusted_client_address(
            b", ".join(forwarded).decode("latin-1")
        )
        return host or peer


class GrabProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering plain grabs itself (see the module)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.grab_route = GrabRoute.of(self.app)

    def on_headers_complete(self) -> None:
        grab = self._plain_grab()
        if grab is None:
            super().on_headers_complete()
            return
        assert self.grab_route is not None  # _plain_grab checked it
        cycle = _GrabCycle(keep_alive=self.parser.should_keep_alive())
        self.cycle = cycle  # type: ignore[assignment]
        task = self.loop.create_task(self._grab(cycle, self.grab_route, *grab, self.headers))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def _plain_grab(self) -> tuple[str, GrabHeaders] | None:
        """The packet id and headers when this request is a grab answered here (see the
        module)."""
        if self.grab_route is None or self.parser.get_method() != b"POST":
            return None
        url: bytes = self.url
        if b"?" in url or b"%" in url or self.root_path or self.expect_100_continue:
            return None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return None  # pipelined behind a request still in flight: uvicorn queues it
        if self.flow.write_paused or self.limit_concurrency is not None:
            return None  # uvicorn's path waits for the client to read, or refuses with 503
        if self.parser.get_http_version() != "1.1" or self.parser.should_upgrade():
            return None
        packet_id = grab_path_target(url.decode("latin-1"))
        if packet_id is None:
            return None
        fields = grab_headers(self.headers)
        if has_body(fields.content_length, fields.transfer_encoding):
            return None
        return packet_id, fields

    async def _grab(
        self,
        cycle: _GrabCycle,
        route: GrabRoute,
        packet_id: str,
        fields: GrabHeaders,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        peer = self.client[0] if self.client else None
        try:
            answer = await route.api.grab_answer(
                packet_id,
                fields.authorization,
                route.client_host(peer, headers),
                fields.on_behalf_of,
            )
        except Exception:
            log.exception("the grab of %s failed", packet_id)
            answer = problem(500, "internal_error", "internal error")
        self._answer(cycle, answer, packet_id)

    def _answer(self, cycle: _GrabCycle, answer: bytes | Response, packet_id: str) -> None:
        """Write the grab's response as uvicorn writes one, then let the connection go on."""
        cycle.response_complete = True
        if cycle.disconnected or self.transport.is_closing():
            return  # the client left (uvicorn marks only the newest request's cycle)
        if isinstance(answer, bytes):
            status, headers, body = 200, granted_headers(answer), answer
        else:
            status, headers, body = answer.status_code, answer.raw_headers, bytes(answer.body)
        if self.access_log:
            # uvicorn's access line, with its arguments (its formatter unpacks them)
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                f"{self.client[0]}:{self.client[1]}" if self.client else "-",
                "POST",
                f"/v1/packets/{packet_id}/grab",
                "1.1",
                status,
            )
        content = [STATUS_LINE[status]]
        for name, value in (*self.server_state.default_headers, *headers):
            content += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", body)
        self.transport.write(b"".join(content))
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()
