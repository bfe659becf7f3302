"""Tokens for the tests, minted with PyJWT directly (not through hongbao's own code), as a
host app's backend would."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ADMIN = "hongbao:admin"
SERVICE = "hongbao:service"


def mint(
    user: str,
    key: Any,
    *,
    algorithm: str = "HS256",
    roles: Sequence[str] = (),
    ttl: int = 3600,
    now: float | None = None,
    kid: str | None = None,
    **claims: Any,
) -> str:
    """A JWT for `user` signed with `key` (bytes for HS256, a private key otherwise)."""
    issued = int(time.time() if now is None else now)
    payload: dict[str, Any] = {"sub": user, "iat": issued, "exp": issued + ttl}
    if roles:
        payload["roles"] = list(roles)
    payload.update(claims)
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(payload, key, algorithm=algorithm, headers=headers)


def hs256(
    user: str, secret: bytes, *, admin: bool = False, service: bool = False, **kw: Any
) -> str:
    """An HS256 token under hongbao's secret, with the admin / service roles if asked."""
    roles = [r for r, on in ((ADMIN, admin), (SERVICE, service)) if on]
    return mint(user, secret, roles=roles, **kw)


def claims_of(token: str, secret: bytes) -> dict[str, Any]:
    """The claims of an HS256 token, checked by PyJWT."""
    decoded: dict[str, Any] = jwt.decode(token, secret, algorithms=["HS256"])
    return decoded


def public_jwk(private: Any, kid: str) -> dict[str, Any]:
    """The JWK of a private key's public half, as an identity provider publishes it."""
    public = private.public_key()
    if isinstance(public, rsa.RSAPublicKey):
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))
    elif isinstance(public, ec.EllipticCurvePublicKey):
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(public))
    else:
        jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(public))
    return {**jwk, "kid": kid, "use": "sig"}
