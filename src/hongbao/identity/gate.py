"""`Identity`: from an Authorization header (and X-On-Behalf-Of) to a verified `Principal`.

A grab request carries a token on the hot path. Verified tokens are kept in a bounded
LRU keyed by the header's text until they expire, so a token seen before costs a dict
lookup, a clock read and the revocation lookup (also a dict) instead of PyJWT's
checks (tens of microseconds; an RSA signature more). Revocations are checked on
every request, cached or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict

from hongbao.domain.ids import valid_user_id
from hongbao.errors import AuthError, Forbidden, InvalidRequest, StorageError
from hongbao.identity.config import IdentityConfig
from hongbao.identity.jwks import JwksKeys
from hongbao.identity.mint import mint_token
from hongbao.identity.principal import DEFAULT_TTL, ON_BEHALF_HEADER, SERVICE_ROLE, Principal
from hongbao.identity.revocation import POLL_INTERVAL, Revocations
from hongbao.identity.tickets import Tickets
from hongbao.identity.verify import TokenVerifier, UnknownKeyId
from hongbao.storage import RedisStore

#: how long `Identity.aclose` waits for the revocations poller to end, seconds
STOP_WAIT = 5.0

log = logging.getLogger("hongbao.identity")

#: verified tokens kept per process (a few hundred bytes each)
CACHE_SIZE = 16_384


class Identity:
    """Token verification, its cache, revocations and tickets for one app."""

    def __init__(self, config: IdentityConfig, *, cache_size: int = CACHE_SIZE) -> None:
        self.config = config
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Principal] = OrderedDict()
        # whichever fetch replaces the keys (the hourly one, or one for an unknown kid),
        # tokens verified with a key withdrawn or replaced under its kid are checked again
        self.jwks = (
            JwksKeys(config.jwks_url, on_withdrawn=self._cache.clear) if config.jwks_url else None
        )
        self.verifier = TokenVerifier(config, self.jwks)
        self.revocations = Revocations()
        self.tickets = Tickets(config.secret)
        self._poller: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    # -- life -----------------------------------------------------------------------------

    async def start(self, store: RedisStore) -> None:
        """Fetch the JWKS (if any), read the revocations and start polling them."""
        if self.jwks is not None:
            await self.jwks.refresh()
        await self.revocations.attach(store)
        self._stopping = asyncio.Event()
        self._poller = asyncio.create_task(self._poll(), name="hongbao-identity")

    async def aclose(self) -> None:
        """Stop polling, waiting at most `STOP_WAIT` for the poller to end. Besides the
        cancellation, the poller checks `_stopping` at every turn: on Python 3.11, redis-py
        sends a command inside `asyncio.wait_for`, which drops a cancellation that arrives
        as the send completes (fixed in 3.12), and the poller would go on polling."""
        if self._poller is not None:
            self._stopping.set()
            self._poller.cancel()
            done, _ = await asyncio.wait([self._poller], timeout=STOP_WAIT)
            for task in done:
                with contextlib.suppress(asyncio.CancelledError):
                    task.result()
            self._poller = None

    async def _poll(self) -> None:
        """Every `POLL_INTERVAL`: the revocations, and the JWKS once it is stale. A turn
        that fails, for whatever reason, is logged and the next one runs: the poller is
        what brings other processes' revocations here, and must outlive any one error."""
        failing = False
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), POLL_INTERVAL)
            if self._stopping.is_set():
                return
            try:
                await self.revocations.poll()
                failing = False
            except Exception as exc:
                if not failing:  # once per run of failures, not every turn
                    # Redis failing is expected (StorageError); anything else, with its
                    # traceback
                    unexpected = not isinstance(exc, StorageError)
                    log.warning("token revocations not refreshed: %r", exc, exc_info=unexpected)
                failing = True
            try:
                if self.jwks is not None and self.jwks.stale:
                    await self.jwks.refresh()  # clears the cache if a key was withdrawn
            except Exception:
                log.exception("JWKS %s not refreshed (unexpected error)", self.config.jwks_url)

    # -- requests -------------------------------------------------------------------------

    async def authenticate(
        self, authorization: str | None, on_behalf_of: str | None = None
    ) -> Principal:
        """The caller of a request; AuthError (401) for a missing, invalid or revoked token,
        Forbidden (403) for X-On-Behalf-Of without the service role."""
        cache = self._cache
        principal = cache.get(authorization) if authorization is not None else None
        if principal is not None and time.time() < principal.expires_at + self.config.leeway:
            cache.move_to_end(authorization)  # type: ignore[arg-type]
        else:
            principal = await self._verify(authorization)
        if self.revocations.revoked:
            self.revocations.check(principal.user_id, principal.issued_at)
        if on_behalf_of is not None:
            return acting_for(principal, on_behalf_of)
        return principal

    async def _verify(self, authorization: str | None) -> Principal:
        token = bearer_token(authorization)
        try:
            principal = self.verifier.verify(token)
        except UnknownKeyId as exc:
            if self.jwks is None or not await self.jwks.refresh_for(exc.kid):
                raise
            principal = self.verifier.verify(token)
        assert authorization is not None  # bearer_token refused a missing header
        cache = self._cache
        cache.pop(authorization, None)
        cache[authorization] = principal
        if len(cache) > self.cache_size:
            cache.popitem(last=False)
        return principal

    async def revoke(self, user_id: str) -> int:
        """Revoke every token of `user_id` issued until now; the unix second recorded."""
        return await self.revocations.revoke(user_id)

    def ticket(self, principal: Principal, packet_id: str) -> str:
        """An event-stream ticket for this caller and packet."""
        return self.tickets.mint(principal, packet_id)

    def check_ticket(self, ticket: str, packet_id: str) -> Principal:
        principal = self.tickets.verify(ticket, packet_id)
        self.revocations.check(principal.actor or principal.user_id, principal.issued_at)
        return principal

    def mint(self, user_id: str, *, ttl: int = DEFAULT_TTL) -> str:
        """A user token under the current secret (the demo sign-in)."""
        return mint_token(self.config.secret, user_id, ttl=ttl)


def acting_for(principal: Principal, user_id: str) -> Principal:
    """The principal of a service acting for `user_id` (X-On-Behalf-Of): the user's rights,
    none of the service's, and the service as the actor the ledger records."""
    if not principal.service:
        raise Forbidden(f"{ON_BEHALF_HEADER} is only for service tokens (role {SERVICE_ROLE})")
    if not valid_user_id(user_id):
        raise InvalidRequest(
            f"{ON_BEHALF_HEADER} must be a user id: 1-64 of letters, digits and _ . : @ -",
            ON_BEHALF_HEADER,
        )
    return Principal(
        user_id, False, False, principal.user_id, principal.issued_at, principal.expires_at
    )


def bearer_token(authorization: str | None) -> str:
    """The token in an ``Authorization: Bearer <token>`` header value; AuthError if absent."""
    if not authorization:
        raise AuthError("missing token: send Authorization: Bearer <token>")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("malformed authorization header: expected Bearer <token>")
    return token.strip()
