"""The web app's endpoints: the page, its static files, live events, demo sign-in, dashboard.

- ``GET /``, ``GET /p/{id}`` (share link), ``GET /me`` (my red packets) and ``GET /admin``:
  the page (one HTML file, the JavaScript picks the screen from the path; ``/#/p/{id}``
  works too).
- ``GET /static/...``: its CSS, JavaScript and strings, packaged with hongbao.
- ``GET /v1/packets/{id}/events``: Server-Sent Events (``text/event-stream``). Each
  ``packet`` event carries ``{"packet": ..., "claims": ...}`` (the bodies of
  ``GET /v1/packets/{id}`` and ``.../claims``), sent on connect and whenever the
  packet changes. A browser's EventSource cannot set headers, so the stream takes
  ``?ticket=...``: a ticket from ``POST /v1/packets/{id}/events/ticket`` (bearer
  token), good for that packet for a minute (`hongbao.identity.tickets`); a bearer
  token never goes into a URL (``?token=`` is refused). One shared poller per
  packet (per process) reads the packet's live status from Redis every 0.5 s, and
  the full state only when it changed, however many pages watch it. A stream ends
  after `STREAM_SECONDS`; the browser reconnects by itself (``retry:`` is sent).
- ``POST /demo/token`` ``{"name": "alice"}``: only in the embedded default (demo
  mode), a user token for that name, and the first sign-in of a name deposits
  `DEMO_DEPOSIT` fen (100 yuan) of demo money into its wallet (once per name: the
  deposit's reference is ``demo-signin:<name>``). Not routed at all otherwise.
- ``GET /admin/stats`` (admin token): the dashboard's numbers, read from the
  service's own Prometheus metrics (grabs/s, persister backlog, dead letters), the
  ledger (live packets) and the audit (`hongbao.audit`; run at most every
  `AUDIT_SECONDS`). With ``--workers N`` the grab
  counts are those of all the workers (the others' up to `PUBLISH_SECONDS` behind).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from hongbao.api.errors import ApiError
from hongbao.api.routes import DEFAULT_CLAIMS_PAGE, Api, read_json
from hongbao.api.schemas import DemoSignIn, claims_json, iso, packet_json
from hongbao.audit import audit
from hongbao.errors import AuthError, Forbidden, HongbaoError
from hongbao.identity.principal import Principal
from hongbao.ratelimit import Limit

log = logging.getLogger("hongbao.web")

STATIC = Path(__file__).parent / "static"
#: demo money deposited on a name's first demo sign-in, fen (100 yuan)
DEMO_DEPOSIT = 10_000
#: lifetime of a demo token, seconds
DEMO_TOKEN_TTL = 86_400
#: demo sign-ins per client address: 30 a minute, up to 30 at once
DEMO_SIGNIN_LIMIT = Limit("ip", rate=0.5, burst=30)
#: how often a watched packet's live status is read from Redis, seconds
POLL_INTERVAL = 0.5
#: a comment line keeps idle streams open through proxies, seconds
HEARTBEAT_SECONDS = 15.0
#: a stream ends after this long (the browser reconnects); bounds stale connections
STREAM_SECONDS = 120.0
#: the browser's reconnect delay after a stream ends, milliseconds
RETRY_MS = 1000
#: live event streams one process serves, and one user may hold, at once
MAX_STREAMS = 1_000
MAX_STREAMS_PER_USER = 5
#: how long an audit result is reused by the dashboard, seconds
AUDIT_SECONDS = 10.0
#: the dashboard counts live packets up to this many
LIVE_PACKETS_CAP = 5_000
#: window over which grabs/s is computed, seconds
RATE_WINDOW = 10.0

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


@dataclass
class _Watch:
    """One shared poller for a packet and the queues of the streams watching it."""

    packet_id: str
    queues: set[asyncio.Queue[str | None]] = field(default_factory=set)
    last: str | None = None
    task: asyncio.Task[None] | None = None


class PacketWatchers:
    """Shared pollers: one task per watched packet, stopped when its last watcher leaves."""

    def __init__(self, api: Api, interval: float = POLL_INTERVAL) -> None:
        self.api = api
        self.interval = interval
        self._watches: dict[str, _Watch] = {}

    @contextlib.asynccontextmanager
    async def watch(self, packet_id: str) -> AsyncIterator[asyncio.Queue[str | None]]:
        """A queue that receives the packet's state (JSON) on every change; None at close."""
        w = self._watches.get(packet_id)
        if w is None:
            w = self._watches[packet_id] = _Watch(packet_id)
            w.task = asyncio.create_task(self._poll(w), name=f"hongbao-watch-{packet_id}")
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=4)
        w.queues.add(queue)
        if w.last is not None:
            queue.put_nowait(w.last)
        try:
            yield queue
        finally:
            w.queues.discard(queue)
            if not w.queues and self._watches.get(packet_id) is w:
                del self._watches[packet_id]
                if w.task is not None:
                    w.task.cancel()

    async def aclose(self) -> None:
        watches = list(self._watches.values())
        self._watches.clear()
        for w in watches:
            if w.task is not None:
                w.task.cancel()
            for queue in w.queues:
                _offer(queue, None)
        await asyncio.gather(*(w.task for w in watches if w.task), return_exceptions=True)

    async def _poll(self, w: _Watch) -> None:
        service = self.api.service
        seen: object = ()
        while True:
            try:
                live = await service.live_status(w.packet_id)
                marker = (
                    None
                    if live is None
                    else (
                        live.shares_left,
                        live.amount_left,
                        live.closed_at_ms,
                        live.now_ms >= live.expires_at_ms,
                    )
                )
                if marker != seen or w.last is None:
                    packet = await service.packet(w.packet_id)
                    claims = await service.claims(w.packet_id, limit=DEFAULT_CLAIMS_PAGE)
                    state = json.dumps(
                        {"packet": packet_json(packet), "claims": claims_json(claims)},
                        ensure_ascii=False,
                        separators=(",", ":"),
                    )
                    seen = marker
                    if state != w.last:
                        w.last = state
                        for queue in list(w.queues):
                            _offer(queue, state)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis or the ledger failed: try again on the next tick
                log.debug("watching packet %s: %s", w.packet_id, exc)
            await asyncio.sleep(self.interval)


class _Slot:
    """One live event stream's place under the caps."""


def _too_many_streams(detail: str) -> ApiError:
    return ApiError(429, "too_many_streams", detail, headers={"Retry-After": "5"})


def demo_user(name: str) -> str:
    """The user a demo sign-in acts as: demo users live apart from every real user."""
    return f"demo-{name}"


def _offer(queue: asyncio.Queue[str | None], item: str | None) -> None:
    """Put without waiting; a slow reader only misses intermediate states."""
    while True:
        try:
            queue.put_nowait(item)
            return
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueEmpty):
                queue.get_nowait()


class WebApp:
    """The web routes of one app (see the module docstring)."""

    def __init__(self, api: Api, *, demo_mode: bool) -> None:
        self.api = api
        self.demo_mode = demo_mode
        self.watchers = PacketWatchers(api)
        self._index = (STATIC / "index.html").read_text(encoding="utf-8")
        self._samples: deque[tuple[float, float, float]] = deque()
        self._audit: tuple[float, dict[str, Any]] | None = None
        self._audit_lock = asyncio.Lock()
        self._closing = False
        self._background: set[asyncio.Future[None]] = set()
        self._handlers: dict[int, tuple[Any, Any]] = {}
        #: the live event streams, all and per user (see `_stream_slot`)
        self._streams: weakref.WeakSet[_Slot] = weakref.WeakSet()
        self._streams_of: dict[str, weakref.WeakSet[_Slot]] = {}

    def routes(self) -> list[BaseRoute]:
        routes: list[BaseRoute] = [
            Route("/", self.page, methods=["GET"]),
            Route("/p/{packet_id}", self.page, methods=["GET"]),
            Route("/me", self.page, methods=["GET"]),
            Route("/admin", self.page, methods=["GET"]),
            Route("/admin/stats", self.admin_stats, methods=["GET"]),
            Route("/v1/packets/{packet_id}/events", self.events, methods=["GET"]),
            Route("/v1/packets/{packet_id}/events/ticket", self.events_ticket, methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
        ]
        if self.demo_mode:
            routes.append(Route("/demo/token", self.demo_token, methods=["POST"]))
        return routes

    def start(self) -> None:
        """Called at app startup: end the event streams as soon as the server is told to stop.

        The server waits for open responses before it shuts down, and an event stream
        never ends by itself, so SIGTERM / SIGINT first close the streams (browsers then
        fall back or reconnect elsewhere) and then reach the server's own handler.
        """
        self._closing = False
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            if not callable(previous):
                continue

            def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
                loop.call_soon_threadsafe(self._close_streams)
                previous(signum, frame)

            signal.signal(sig, handler)
            self._handlers[sig] = (handler, previous)

    def _close_streams(self) -> None:
        self._closing = True
        task = asyncio.ensure_future(self.watchers.aclose())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        self._closing = True
        if threading.current_thread() is threading.main_thread():
            for sig, (ours, previous) in self._handlers.items():
                if signal.getsignal(sig) is ours:
                    signal.signal(sig, previous)
        self._handlers.clear()
        await self.watchers.aclose()

    # -- the page -------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        html = self._index.replace("{{DEMO}}", "1" if self.demo_mode else "0")
        return Response(
            html,
            media_type="text/html; charset=utf-8",
            headers={"Cache-Control": "no-cache", "Content-Security-Policy": CSP},
        )

    # -- demo sign-in ---------------------------------------------------------------------

    async def demo_token(self, request: Request) -> Response:
        ip = request.client.host if request.client else None
        if ip:
            await self.api.service.limiter.take("demo", DEMO_SIGNIN_LIMIT, ip)
        body = await read_json(request, DemoSignIn)
        user_id = demo_user(body.name)
        wallet = await self.api.service.deposit(
            user_id, DEMO_DEPOSIT, reference=f"demo-signin:{body.name}"
        )
        token = self.api.identity.mint(user_id, ttl=DEMO_TOKEN_TTL)
        return JSONResponse(
            {"token": token, "user_id": user_id, "balance": wallet.balance}, status_code=201
        )

    # -- live events ----------------------------------------------------------------------

    async def events_ticket(self, request: Request) -> Response:
        """A ticket for this packet's event stream, for any caller who may read it."""
        caller = await self.api.caller(request)
        packet_id: str = request.path_params["packet_id"]
        await self.api.service.packet(packet_id)  # 404 for no such packet
        tickets = self.api.identity.tickets
        return JSONResponse(
            {"ticket": tickets.mint(caller, packet_id), "expires_in": tickets.ttl},
            headers={"Cache-Control": "no-store"},
        )

    async def _stream_caller(self, request: Request, packet_id: str) -> Principal:
        """The caller of an event stream: a ticket for the packet, or a bearer header."""
        query = request.query_params
        if "token" in query:
            raise AuthError(
                "the event stream takes no token in its URL: POST "
                f"/v1/packets/{packet_id}/events/ticket and pass ?ticket=<ticket>"
            )
        ticket = query.get("ticket")
        if ticket is not None:
            return self.api.identity.check_ticket(ticket, packet_id)
        return await self.api.caller(request)

    async def events(self, request: Request) -> Response:
        packet_id: str = request.path_params["packet_id"]
        caller = await self._stream_caller(request, packet_id)
        await self.api.service.packet(packet_id)  # 404 before the stream starts
        slot = self._stream_slot(caller.user_id)  # 429 over the caps

        async def stream() -> AsyncIterator[str]:
            try:
                async for chunk in self._stream(packet_id):
                    yield chunk
            finally:
                self._release(slot, caller.user_id)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def _stream_slot(self, user_id: str) -> _Slot:
        """Room for one more event stream of `user_id`; 429 `too_many_streams` when the user
        or this process has the most it may. A slot is freed when its stream ends, or
        when the response holding it is dropped without ever streaming (weak sets)."""
        mine = self._streams_of.setdefault(user_id, weakref.WeakSet())
        if len(self._streams) >= MAX_STREAMS:
            raise _too_many_streams("this server has as many live streams as it serves")
        if len(mine) >= MAX_STREAMS_PER_USER:
            raise _too_many_streams(f"at most {MAX_STREAMS_PER_USER} live streams per user")
        slot = _Slot()
        self._streams.add(slot)
        mine.add(slot)
        return slot

    def _release(self, slot: _Slot, user_id: str) -> None:
        self._streams.discard(slot)
        mine = self._streams_of.get(user_id)
        if mine is not None:
            mine.discard(slot)
            if not mine:
                del self._streams_of[user_id]

    async def _stream(self, packet_id: str) -> AsyncIterator[str]:
        """The text of one event stream: the packet's state now and at every change."""
        yield f"retry: {RETRY_MS}\n\n"
        if self._closing:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STREAM_SECONDS
        async with self.watchers.watch(packet_id) as queue:
            while (left := deadline - loop.time()) > 0:
                try:
                    item = await asyncio.wait_for(queue.get(), min(HEARTBEAT_SECONDS, left))
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if item is None:
                    return
                yield f"event: packet\ndata: {item}\n\n"

    # -- dashboard ------------------------------------------------------------------------

    async def admin_stats(self, request: Request) -> Response:
        caller = await self.api.caller(request)
        if not caller.admin:
            raise Forbidden("the dashboard needs an admin token")
        service = self.api.service
        metrics = self.api.metrics
        fresh = await metrics.refresh(service.store)
        grabs, _, _ = metrics.grabs.totals()  # all workers' grabs
        backlog, dead_letters = metrics.gauge_values()
        per_second, granted_per_second = self._rates(
            float(sum(grabs.values())), float(grabs["granted"])
        )
        live, capped = await self._live_packets()
        return JSONResponse(
            {
                "grabs_per_second": per_second,
                "granted_per_second": granted_per_second,
                "grabs_total": grabs,
                "backlog": _gauge(backlog, fresh),
                "dead_letters": _gauge(dead_letters, fresh),
                "live_packets": live,
                "live_packets_capped": capped,
                "audit": await self._audit_status(),
                "process": os.getpid(),
                "at": iso(datetime.now(UTC)),
            },
            headers={"Cache-Control": "no-store"},
        )

    def _rates(self, total: float, granted: float) -> tuple[float | None, float | None]:
        now = time.monotonic()
        samples = self._samples
        samples.append((now, total, granted))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW:
            samples.popleft()
        then, old_total, old_granted = samples[0]
        if now - then < 0.2:
            return None, None
        return (
            round((total - old_total) / (now - then), 2),
            round((granted - old_granted) / (now - then), 2),
        )

    async def _live_packets(self) -> tuple[int | None, bool]:
        ledger = self.api.service.ledger
        count, after = 0, ""
        try:
            while count < LIVE_PACKETS_CAP:
                batch = await ledger.open_packets(after_id=after)
                if not batch:
                    return count, False
                count += len(batch)
                after = batch[-1].id
        except (HongbaoError, OSError):
            return None, False
        return count, True

    async def _audit_status(self) -> dict[str, Any]:
        async with self._audit_lock:
            now = time.monotonic()
            if self._audit is not None and now - self._audit[0] < AUDIT_SECONDS:
                return self._audit[1]
            status: dict[str, Any]
            try:
                # Redis against the ledger, and the ledger's own invariants; never waits
                # for the persister
                report = await audit(self.api.service, settle=0)
                problems = list(report.violations)
                status = {
                    "ok": not problems,
                    "problem_count": len(problems),
                    "problems": problems[:20],
                }
            except Exception as exc:  # the database refused: report it, keep the page up
                status = {
                    "ok": None,
                    "problem_count": None,
                    "problems": [f"audit failed: {type(exc).__name__}"],
                }
            status["checked_at"] = iso(datetime.now(UTC))
            self._audit = (now, status)
            return status


def _gauge(value: float | None, fresh: bool) -> int | None:
    return int(value) if fresh and value is not None else None
