"""`POST /v1/packets/{packet_id}/grab` answered before Starlette's routing.

A grab is the one request that comes in storms, and every await in it resumes through
each ASGI layer above it. This middleware sits right under Starlette's error middleware
(so an unexpected error still becomes the 500 problem document) and hands the grab
straight to `Api.grab_answer`, the same code the routed endpoint runs. A granted grab's
200 is sent as two ASGI messages built here, with the headers every response carries
(see docs/performance.md for what a Starlette Response object would cost). Everything
else, and any path it does not recognise exactly, goes on to the router unchanged.

A grab has no body, except one that sends a packet's passphrase: only a request whose
headers announce a body has it read (up to MAX_BODY), and checked after the token.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from starlette.types import ASGIApp, Receive, Scope, Send

from hongbao.api.headers import SECURITY_HEADERS
from hongbao.api.routes import MAX_BODY, Api, grab_body, has_body

_PREFIX = "/v1/packets/"
_SUFFIX = "/grab"
#: the header Starlette's Response(media_type="application/json") sends
_JSON = (b"content-type", b"application/json")


class GrabFastPath:
    def __init__(self, app: ASGIApp, api: Api) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        packet_id = _grab_target(scope)
        if packet_id is None:
            await self.app(scope, receive, send)
            return
        fields = grab_headers(scope["headers"])
        body = None
        if has_body(fields.content_length, fields.transfer_encoding):
            body = grab_body(fields.content_type, await _read_body(receive))
        client = scope.get("client")
        answer = await self.api.grab_answer(
            packet_id,
            fields.authorization,
            client[0] if client else None,
            fields.on_behalf_of,
            body,
        )
        if isinstance(answer, bytes):
            headers = granted_headers(answer)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": answer})
        else:
            await answer(scope, receive, send)


class GrabHeaders(NamedTuple):
    """The request headers a grab reads: the first of each, as Starlette's headers.get."""

    authorization: str | None
    on_behalf_of: str | None
    content_length: str | None
    transfer_encoding: str | None
    content_type: str | None


#: the headers a grab reads, by their position in GrabHeaders
_GRAB_HEADER_AT = {
    b"authorization": 0,
    b"x-on-behalf-of": 1,
    b"content-length": 2,
    b"transfer-encoding": 3,
    b"content-type": 4,
}


def grab_headers(headers: Iterable[tuple[bytes, bytes]]) -> GrabHeaders:
    """The grab's headers out of ASGI's (lower-case name, value) pairs."""
    found: list[str | None] = [None] * len(_GRAB_HEADER_AT)
    for name, value in headers:
        at = _GRAB_HEADER_AT.get(name)
        if at is not None and found[at] is None:
            found[at] = value.decode("latin-1")
    return GrabHeaders(*found)


def granted_headers(answer: bytes) -> list[tuple[bytes, bytes]]:
    """The headers of a granted grab's 200 carrying `answer`, in the order a Starlette
    Response given these headers sends them."""
    return [*SECURITY_HEADERS, (b"content-length", b"%d" % len(answer)), _JSON]


def _grab_target(scope: Scope) -> str | None:
    """The packet id of a grab request, or None for anything the router should see."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    return grab_path_target(scope["path"])


def grab_path_target(path: str) -> str | None:
    """The packet id in a grab's path `/v1/packets/{packet_id}/grab`, else None."""
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    packet_id = path[len(_PREFIX) : -len(_SUFFIX)]
    if not packet_id or "/" in packet_id:
        return None  # the router's {packet_id} matches one non-empty path segment
    return packet_id


async def _read_body(receive: Receive) -> bytes | None:
    """The request's body; None once it passes MAX_BODY (the rest is left unread)."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: what came is all there is
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)
