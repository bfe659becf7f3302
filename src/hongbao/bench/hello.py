"""Hello world on the same stack as the API (Starlette on uvicorn): the HTTP ceiling.

`hongbao bench` runs it with the options `hongbao serve --workers 2` uses and loads it with
the same wrk script as the grab endpoint, so the ratio of the two shows what the grab
itself costs. ``uvicorn hongbao.bench.hello:app --workers 2``
"""

from __future__ import annotations

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
