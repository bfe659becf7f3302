"""Headers every response carries: no content-type sniffing, no referrer sent onwards."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: the headers, as ASGI sends them
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
#: the same, for a Starlette Response's `headers`
SECURITY_HEADER_TEXT = {name.decode(): value.decode() for name, value in SECURITY_HEADERS}


class SecurityHeaders:
    """Adds `SECURITY_HEADERS` to each HTTP response that passes through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if SECURITY_HEADERS[0] not in headers:  # a problem document has them already
                    headers.extend(SECURITY_HEADERS)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
