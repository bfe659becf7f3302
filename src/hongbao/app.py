"""The ASGI app: the JSON API (`hongbao.api`) and the web page (`hongbao.web`) in one
Starlette app, with the service started by its lifespan; a factory for uvicorn workers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from hongbao.api.errors import EXCEPTION_HANDLERS
from hongbao.api.fastpath import GrabFastPath
from hongbao.api.headers import SecurityHeaders
from hongbao.api.history import HistoryApi
from hongbao.api.openapi import build_openapi
from hongbao.api.routes import Api
from hongbao.api.webhooks import WebhooksApi
from hongbao.api.withdrawals import WithdrawalsApi
from hongbao.identity import redact
from hongbao.identity.config import IdentityConfig
from hongbao.identity.gate import Identity
from hongbao.metrics import Metrics
from hongbao.runtime import running_service
from hongbao.settings import Settings
from hongbao.web.routes import WebApp

#: environment read by `app_from_env` (set by `hongbao serve --workers N` for its workers)
ENV_DATA_DIR = "HONGBAO_DATA_DIR"
ENV_DEMO = "HONGBAO_DEMO_MODE"
#: the folder where the workers share their grab tallies (see `hongbao.metrics`)
ENV_METRICS_DIR = "HONGBAO_METRICS_DIR"
#: ``host:port`` of a /metrics listener of its own (empty: /metrics on the API's address)
ENV_METRICS_ADDRESS = "HONGBAO_METRICS_ADDRESS"


def create_app(
    settings: Settings,
    identity: IdentityConfig | bytes,
    *,
    run_workers: bool,
    demo_mode: bool = False,
    metrics_dir: Path | None = None,
    metrics_address: tuple[str, int] | None = None,
) -> Starlette:
    """The HTTP API over a service built from `settings` when the app starts.

    `run_workers` also runs the persister and expiry sweeper in this process (one
    process of a deployment should, or a separate `hongbao worker`). The web app
    (`hongbao.web`) is served at ``/``; `demo_mode` (``serve --demo``) adds its demo
    sign-in endpoint ``POST /demo/token``. Workers of one server pass the same
    `metrics_dir`, so that any of them answers ``/metrics`` with all their grabs; with
    `metrics_address`, ``/metrics`` is served there (each worker listens on it, the port
    shared) and not on the API's address. `identity` says how tokens are checked (bytes:
    HS256 under that secret alone).
    """
    config = identity if isinstance(identity, IdentityConfig) else IdentityConfig(identity)
    redact.install()  # no token= or ticket= value reaches the access log
    api = Api(settings, Identity(config), Metrics(metrics_dir))
    web = WebApp(api, demo_mode=demo_mode)
    api.openapi = json.dumps(
        build_openapi(settings, demo_mode=demo_mode, metrics=metrics_address is None),
        ensure_ascii=False,
    ).encode()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        keys = config.passphrase_keys()
        async with running_service(settings, workers=run_workers, passphrase_keys=keys) as runtime:
            await api.identity.start(runtime.service.store)
            api.runtime = runtime
            web.start()
            publisher = (
                asyncio.create_task(api.metrics.publish_forever())
                if metrics_dir is not None
                else None
            )
            listener = (
                await _metrics_listener(api, metrics_address)
                if metrics_address is not None
                else None
            )
            try:
                yield
            finally:
                if listener is not None:
                    await listener.shutdown()
                if publisher is not None:
                    publisher.cancel()
                    await asyncio.gather(publisher, return_exceptions=True)
                    api.metrics.grabs.publish()  # the last grabs of this worker count too
                await web.aclose()
                await api.identity.aclose()
                api.runtime = None

    app = Starlette(
        routes=[
            *api.routes(metrics=metrics_address is None),
            *HistoryApi(api).routes(),
            *WithdrawalsApi(api).routes(),
            *WebhooksApi(api).routes(),
            *web.routes(),
        ],
        # the grab's fast path first (its answers carry the security headers themselves)
        middleware=[Middleware(GrabFastPath, api=api), Middleware(SecurityHeaders)],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    app.state.api = api
    return app


async def _metrics_listener(api: Api, address: tuple[str, int]) -> uvicorn.Server:
    """A second listener serving only ``GET /metrics``, on `address`.

    Its socket shares the port (SO_REUSEPORT) so that each worker of one server can
    listen; any of them answers with the grabs of all (the shared metrics folder)."""
    host, port = address
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    metrics_app = Starlette(
        routes=[Route("/metrics", api.metrics_text, methods=["GET"])],
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    config = uvicorn.Config(metrics_app, lifespan="off", access_log=False, log_level="warning")
    config.load()
    server = uvicorn.Server(config)
    # what Server.serve does before startup, without taking over the process's signal
    # handlers (the API's own server has them) or running a main loop of its own
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    return server


def app_from_env() -> Starlette:
    """App factory for uvicorn worker processes: settings and identity from the environment."""
    data_dir = os.environ.get(ENV_DATA_DIR)
    identity = IdentityConfig.from_env(data_dir=Path(data_dir) if data_dir else None)
    metrics_dir = os.environ.get(ENV_METRICS_DIR)
    host, _, port = os.environ.get(ENV_METRICS_ADDRESS, "").rpartition(":")
    return create_app(
        Settings.from_env(),
        identity,
        run_workers=False,
        demo_mode=os.environ.get(ENV_DEMO) == "1",
        metrics_dir=Path(metrics_dir) if metrics_dir else None,
        metrics_address=(host, int(port)) if port else None,
    )
