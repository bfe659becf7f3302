"""Hello world on the same stack as the API (Starlette on uvicorn): the HTTP ceiling.

`hongbao bench` runs it as `hongbao serve --workers 2` runs the API (the same worker
processes and uvicorn options) and loads it with the same wrk script as the grab
endpoint, so the ratio of the two shows what the grab itself costs.
``python -m hongbao_bench.hello PORT WORKERS``
"""

from __future__ import annotations

import sys

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


async def hello(request: Request) -> Response:
    return JSONResponse({"hello": "world"})


app = Starlette(
    routes=[
        Route("/healthz", hello, methods=["GET"]),
        Route("/v1/packets/{packet_id}/grab", hello, methods=["POST"]),
    ]
)


if __name__ == "__main__":
    from hongbao.serving.workers import serve_workers, uvicorn_options

    port, workers = int(sys.argv[1]), int(sys.argv[2])
    options = uvicorn_options("127.0.0.1", port, "info", access_log=False, trusted_proxies=[])
    sys.exit(serve_workers("hongbao_bench.hello:app", workers, options))
