"""Token revocation without rotating keys: "refuse every token of this user issued until now".

The revocations live in Redis (a hash of user id -> unix second, and a version counter
bumped by each revocation), so they reach every API process and outlive their restarts.
Each process keeps a local copy, a dict looked up on every request (no Redis call per
request): it polls the version every `POLL_INTERVAL` seconds and reads the whole table
only when the version moved; the process that revokes reads it back at once. A token
is refused when its user has a revocation at or after its ``iat`` (a token without an
``iat`` is refused whenever its user has one).

Should Redis lose the table (flushed, restarted without persistence), the copy is
rebuilt from what Redis holds, nothing revoked, and a warning says so.
"""

from __future__ import annotations

import logging
import time

from hongbao.errors import AuthError
from hongbao.storage import RedisStore

log = logging.getLogger("hongbao.identity")

POLL_INTERVAL = 0.5


class Revocations:
    """This process's copy of the revocations (see the module docstring)."""

    def __init__(self) -> None:
        #: user id -> unix second; replaced whole on every change, never mutated
        self.revoked: dict[str, int] = {}
        self.version: int | None = None
        self.store: RedisStore | None = None

    async def attach(self, store: RedisStore) -> None:
        """Read the revocations from `store`, which later polls read too."""
        self.store = store
        await self.reload()

    def check(self, user_id: str, issued_at: int | None) -> None:
        """AuthError if the user's tokens issued at `issued_at` are revoked."""
        until = self.revoked.get(user_id)
        if until is not None and (issued_at is None or issued_at <= until):
            raise AuthError("token revoked: sign in again for a new one")

    async def revoke(self, user_id: str, now: float | None = None) -> int:
        """Revoke every token of `user_id` issued until now (whole seconds, so a token made
        in the same second is refused too); the unix second recorded."""
        if self.store is None:
            raise RuntimeError("revocations are not attached to a store")
        until = int(time.time() if now is None else now)
        await self.store.revoke_tokens(user_id, until)
        await self.reload()
        return max(until, self.revoked.get(user_id, until))

    async def poll(self) -> None:
        """Read the table again if its version moved (one GET otherwise)."""
        if self.store is not None and await self.store.revocations_version() != self.version:
            await self.reload()

    async def reload(self) -> None:
        if self.store is None:
            return
        version, table = await self.store.revocations()
        if version is None and self.version is not None:
            log.warning(
                "the token revocations are gone from Redis (flushed, or restarted without "
                "persistence): nothing is revoked any more; revoke again where needed"
            )
        self.revoked, self.version = table, version
