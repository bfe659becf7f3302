"""Event-stream tickets: short-lived, for one packet, safe to put in a URL.

A browser's EventSource cannot send an Authorization header, so the event stream takes
``?ticket=``. A ticket is an HS256 JWT under a key derived from the secret (so a ticket
is never a bearer token, nor a bearer token a ticket) naming its user and packet, and
living `TICKET_TTL` seconds: what a log or a browser history may keep of it is soon
worthless.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

import jwt

from hongbao.errors import AuthError
from hongbao.identity.principal import Principal

TICKET_TTL = 60


class Tickets:
    """Mints and checks event-stream tickets under one secret."""

    def __init__(self, secret: bytes, ttl: int = TICKET_TTL) -> None:
        self.key = hmac.new(secret, b"hongbao event-stream tickets", hashlib.sha256).digest()
        self.ttl = ttl

    def mint(self, principal: Principal, packet_id: str, now: float | None = None) -> str:
        issued = int(time.time() if now is None else now)
        claims: dict[str, Any] = {
            "sub": principal.user_id,
            "pkt": packet_id,
            "iat": issued,
            "exp": issued + self.ttl,
        }
        if principal.actor is not None:
            claims["act"] = principal.actor
        return jwt.encode(claims, self.key, algorithm="HS256")

    def verify(self, ticket: str, packet_id: str) -> Principal:
        """The principal a ticket was issued to; AuthError if it is not a valid ticket for
        this packet."""
        try:
            claims = jwt.decode(
                ticket,
                self.key,
                algorithms=["HS256"],
                options={"require": ["exp", "iat", "sub", "pkt"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("ticket expired: ask for a new one") from None
        except jwt.PyJWTError:
            raise AuthError(
                "invalid ticket: POST /v1/packets/{id}/events/ticket makes one"
            ) from None
        if claims["pkt"] != packet_id:
            raise AuthError("this ticket is for another packet")
        actor = claims.get("act")
        return Principal(
            str(claims["sub"]),
            False,
            False,
            actor if isinstance(actor, str) else None,
            int(claims["iat"]),
            int(claims["exp"]),
        )
