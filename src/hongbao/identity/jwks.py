"""The host app's public keys: a JWKS document (by URL) or one PEM file, read at start.

A JWKS is fetched when the app starts, then kept. A token naming a key id (``kid``) the
cache lacks makes it fetch again (the provider rotated its keys), at most once per
`min_refresh` seconds whatever the tokens say, so that made-up kids cannot turn
hongbao into a load generator against the provider; concurrent requests share one
fetch. The document is also fetched again after `max_age` seconds (keys the provider
withdrew stop working). A failed fetch keeps the keys in hand: a provider that is
down does not sign anyone out. Fetches run in a thread (urllib is blocking), so the
event loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)

from hongbao.errors import ConfigurationError
from hongbao.identity.config import ASYMMETRIC_ALGORITHMS

log = logging.getLogger("hongbao.identity")

#: a kid the cache lacks triggers a fetch at most this often, seconds
MIN_REFRESH = 60.0
#: the document is fetched again this long after the last success, seconds
MAX_AGE = 3600.0
FETCH_TIMEOUT = 5.0
#: larger documents are refused (a JWKS holds a few keys, a few KiB)
MAX_DOCUMENT = 1 << 20


class VerifyKey(NamedTuple):
    """A public key and the one algorithm it verifies."""

    algorithm: str
    key: Any  # what jwt.decode takes: a PyJWK or a cryptography public key


def pem_key(path: Path) -> VerifyKey:
    """The public key in a PEM file; its algorithm follows from its type (RSA: RS256,
    EC P-256: ES256, Ed25519 / Ed448: EdDSA). ConfigurationError if it is none of these."""
    try:
        key = load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"HONGBAO_JWT_PUBLIC_KEY_FILE {path}: {exc}") from None
    if isinstance(key, rsa.RSAPublicKey):
        return VerifyKey("RS256", key)
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return VerifyKey("ES256", key)
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return VerifyKey("EdDSA", key)
    raise ConfigurationError(
        f"HONGBAO_JWT_PUBLIC_KEY_FILE {path}: an RSA, EC P-256 or Ed25519 public key is needed"
    )


def parse_jwks(document: bytes) -> dict[str | None, VerifyKey]:
    """The signing keys of a JWKS document by kid (None for a key without one); keys for
    other algorithms, encryption keys and malformed members are left out, each on its
    own, so one bad member does not cost the others."""
    try:
        data = json.loads(document)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not a usable JWKS: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("not a usable JWKS: the document is not a JSON object")
    members = data.get("keys")
    if not isinstance(members, list):
        raise ValueError("not a usable JWKS: its keys member is not a list")
    out: dict[str | None, VerifyKey] = {}
    for member in members:
        found = _signing_key(member)
        if found is not None:
            out[found[0]] = found[1]
    if not out:
        raise ValueError("the JWKS holds no RS256, ES256 or EdDSA signing key")
    return out


def _signing_key(member: object) -> tuple[str | None, VerifyKey] | None:
    """A JWKS member's kid and key, if it is a well-formed RS256, ES256 or EdDSA public
    signing key; None for anything else. The members' values come from the provider's
    document: a kid or alg of another JSON type than a string (a list is unhashable), a
    private key (``d``: a JWKS publishes public keys, and PyJWT verifies with public
    ones only) or a key PyJWT cannot build is left out, whatever exception building it
    raises."""
    if not isinstance(member, dict) or "d" in member:
        return None
    kid, alg, use = member.get("kid"), member.get("alg"), member.get("use")
    if not (kid is None or isinstance(kid, str)) or not (alg is None or isinstance(alg, str)):
        return None
    if use is not None and use != "sig":
        return None
    try:
        key = jwt.PyJWK(member)
    except Exception:  # any failure to build one key leaves out that key only
        return None
    if key.algorithm_name not in ASYMMETRIC_ALGORITHMS:
        return None
    return kid, VerifyKey(key.algorithm_name, key)


def key_material(key: VerifyKey) -> tuple[str, bytes]:
    """What a key verifies with: its algorithm and its public key (DER), to tell a key
    replaced under the same kid from the same key fetched again."""
    public = key.key.key if isinstance(key.key, jwt.PyJWK) else key.key
    der: bytes = public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return key.algorithm, der


def withdrawn(old: dict[str | None, VerifyKey], new: dict[str | None, VerifyKey]) -> bool:
    """Whether some key of `old` is gone from `new`, or has another key under its kid:
    tokens it signed must not be accepted any more."""
    for kid, key in old.items():
        replacement = new.get(kid)
        if replacement is None or key_material(replacement) != key_material(key):
            return True
    return False


class JwksKeys:
    """The keys of a JWKS URL (https://, http:// or file://), cached (module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        min_refresh: float = MIN_REFRESH,
        max_age: float = MAX_AGE,
        timeout: float = FETCH_TIMEOUT,
        on_withdrawn: Callable[[], None] | None = None,
    ) -> None:
        self.url = url
        #: called when a fetch replaces the keys and some key in hand is gone or changed
        self.on_withdrawn = on_withdrawn
        self.min_refresh = min_refresh
        self.max_age = max_age
        self.timeout = timeout
        self.keys: dict[str | None, VerifyKey] = {}
        #: monotonic time of the last successful fetch, and of the last one a kid asked for
        self.fetched_at: float | None = None
        self._asked_at: float | None = None
        #: monotonic time of the last fetch tried, whatever came of it
        self._tried_at: float | None = None
        self._fetching: asyncio.Task[bool] | None = None

    def get(self, kid: str | None) -> VerifyKey | None:
        """The key named `kid`; without a kid, the only key (None when there are several)."""
        if kid is None:
            if len(self.keys) == 1:
                return next(iter(self.keys.values()))
            return self.keys.get(None)
        return self.keys.get(kid)

    @property
    def stale(self) -> bool:
        """True when the keys are older than `max_age` (or were never fetched) and no fetch
        was tried in the last `min_refresh` seconds (a provider that is down is not
        asked again and again)."""
        now = time.monotonic()
        if self._tried_at is not None and now - self._tried_at < self.min_refresh:
            return False
        return self.fetched_at is None or now - self.fetched_at >= self.max_age

    async def refresh_for(self, kid: str | None) -> bool:
        """Fetch again for a kid the cache lacks, unless one was fetched for that reason
        less than `min_refresh` seconds ago; True if the cache holds the kid now."""
        now = time.monotonic()
        if self._fetching is None and (
            self._asked_at is not None and now - self._asked_at < self.min_refresh
        ):
            return False
        self._asked_at = now
        await self.refresh()
        return self.get(kid) is not None

    async def refresh(self) -> bool:
        """Fetch the document now (concurrent callers share one fetch); False if it failed,
        the keys in hand then stay."""
        if self._fetching is None:
            self._fetching = asyncio.create_task(self._refresh())
            self._fetching.add_done_callback(self._fetched)
        return await asyncio.shield(self._fetching)

    def _fetched(self, task: asyncio.Task[bool]) -> None:
        self._fetching = None

    async def _refresh(self) -> bool:
        self._tried_at = time.monotonic()
        held = f"keeping the {len(self.keys)} key(s) in hand" if self.keys else "no keys yet"
        try:
            keys = await asyncio.to_thread(self._fetch)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            log.warning("JWKS %s could not be fetched (%r): %s", self.url, exc, held)
            return False
        except Exception:
            # whatever else a fetch raises is a failed fetch too: the keys in hand stay,
            # and neither a request nor the identity poller dies of it
            log.exception("JWKS %s could not be fetched (unexpected error): %s", self.url, held)
            return False
        old, self.keys = self.keys, keys
        self.fetched_at = time.monotonic()
        if self.on_withdrawn is not None and withdrawn(old, keys):
            self.on_withdrawn()
        return True

    def _fetch(self) -> dict[str | None, VerifyKey]:
        """Read and parse the document (blocking: run in a thread)."""
        if self.url.startswith("file://"):
            path = urllib.request.url2pathname(urllib.parse.urlsplit(self.url).path)
            with open(path, "rb") as f:
                document = f.read(MAX_DOCUMENT + 1)
        else:
            request = urllib.request.Request(
                self.url, headers={"Accept": "application/json", "User-Agent": "hongbao"}
            )
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                document = response.read(MAX_DOCUMENT + 1)
        if len(document) > MAX_DOCUMENT:
            raise ValueError(f"the document is larger than {MAX_DOCUMENT} bytes")
        return parse_jwks(document)
