"""Identifiers: packet ids are time-ordered and random; user ids are validated text."""

from __future__ import annotations

import re
import secrets
import time

from hongbao.errors import InvalidRequest

#: user ids: 1-64 of A-Za-z0-9_.:@- (also the JSON Schema pattern in /openapi.json)
USER_ID_PATTERN = r"^[A-Za-z0-9_.:@-]{1,64}$"
PACKET_ID_PATTERN = re.compile(r"^[0-9a-hjkmnp-tv-z]{26}$")
_USER_ID = re.compile(USER_ID_PATTERN)
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def new_packet_id(now_ms: int | None = None) -> str:
    """26 characters: 48 bits of milliseconds then 80 random bits (sorts by creation)."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms << 80) | secrets.randbits(80)
    return "".join(_ALPHABET[(value >> shift) & 31] for shift in range(125, -1, -5))


def valid_user_id(user_id: object) -> bool:
    return isinstance(user_id, str) and _USER_ID.fullmatch(user_id) is not None


def valid_packet_id(packet_id: object) -> bool:
    return isinstance(packet_id, str) and PACKET_ID_PATTERN.fullmatch(packet_id) is not None


def require_user_id(user_id: object, field: str = "user_id") -> str:
    """`user_id` if it is a valid user id, else InvalidRequest naming `field`."""
    if isinstance(user_id, str):
        # every grab checks its user: ids of letters and digits pass two str methods, at
        # half what the pattern costs; any other id gets the pattern
        if user_id.isascii() and user_id.isalnum() and len(user_id) <= 64:
            return user_id
        if _USER_ID.fullmatch(user_id) is not None:
            return user_id
    if not valid_user_id(user_id):
        raise InvalidRequest(
            f"{field} must be 1-64 characters of letters, digits and _ . : @ -", field
        )
    return str(user_id)
