"""HS256 JWTs signed with hongbao's secret: what `hongbao token` and the demo sign-in issue.

Any JWT library can mint the same: ``{"sub", "iat", "exp", "roles"}`` signed with
HMAC-SHA256 under ``HONGBAO_SECRET``; the ``kid`` header (`key_id`) lets the verifier
pick the secret at once when several are configured (rotation).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import jwt

from hongbao.domain.ids import valid_user_id
from hongbao.errors import InvalidRequest
from hongbao.identity.config import require_secret
from hongbao.identity.principal import ADMIN_ROLE, DEFAULT_TTL, MAX_ADMIN_TTL, SERVICE_ROLE


def key_id(secret: bytes) -> str:
    """The ``kid`` naming an HS256 secret: 16 hex characters of its SHA-256."""
    return hashlib.sha256(b"hongbao-kid:" + secret).hexdigest()[:16]


def roles_of(*, admin: bool = False, service: bool = False) -> list[str]:
    """The role names for the flags, in a stable order."""
    return [role for role, on in ((ADMIN_ROLE, admin), (SERVICE_ROLE, service)) if on]


def mint_tokens(
    secret: bytes,
    user_ids: Sequence[str],
    *,
    admin: bool = False,
    service: bool = False,
    ttl: int = DEFAULT_TTL,
    now: float | None = None,
) -> list[str]:
    """An HS256 JWT per user, all issued at `now` (default: the clock), valid `ttl` seconds.

    InvalidRequest for a bad user id, a ttl that is not a positive whole number of
    seconds, or an admin ttl over MAX_ADMIN_TTL."""
    require_secret(secret)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
        raise InvalidRequest("ttl must be a positive number of seconds", field="ttl")
    if admin and ttl > MAX_ADMIN_TTL:
        raise InvalidRequest(
            f"an admin token lives at most {MAX_ADMIN_TTL} seconds (24 h)", field="ttl"
        )
    bad = next((u for u in user_ids if not valid_user_id(u)), None)
    if bad is not None:
        raise InvalidRequest(f"invalid user id {bad!r}", field="user_id")
    issued = int(time.time() if now is None else now)
    headers = {"kid": key_id(secret)}
    claims: dict[str, object] = {"iat": issued, "exp": issued + ttl}
    roles = roles_of(admin=admin, service=service)
    if roles:
        claims["roles"] = roles
    return [
        jwt.encode({"sub": user, **claims}, secret, algorithm="HS256", headers=headers)
        for user in user_ids
    ]


def mint_token(
    secret: bytes,
    user_id: str,
    *,
    admin: bool = False,
    service: bool = False,
    ttl: int = DEFAULT_TTL,
    now: float | None = None,
) -> str:
    """One token (see `mint_tokens`)."""
    (token,) = mint_tokens(secret, [user_id], admin=admin, service=service, ttl=ttl, now=now)
    return token
