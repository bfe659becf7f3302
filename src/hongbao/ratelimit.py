"""Per-user and per-IP rate limits (token buckets in Redis), for grab and send.

Settings: `rate_limit_user` and `rate_limit_ip` (requests per second, 0 turns a
limit off) and `rate_limit_burst` (requests allowed at once above the steady
rate). Each action (``grab``, ``send``) has its own buckets. The buckets live in
Redis, so every API process of a deployment shares them. The client IP is the
socket peer, or the address a trusted proxy names (`serve --trusted-proxies`). If
Redis cannot answer, the limiter lets the request through: the request then fails
or succeeds on its own merits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hongbao.errors import RateLimited, StorageError
from hongbao.keys import rate_limit_key
from hongbao.settings import Settings
from hongbao.storage.redis import RedisStore

log = logging.getLogger("hongbao.ratelimit")


@dataclass(frozen=True)
class Limit:
    scope: str  # "user" or "ip"
    rate: float
    burst: int


class RateLimiter:
    def __init__(self, store: RedisStore, settings: Settings) -> None:
        self.store = store
        burst = max(1, settings.rate_limit_burst)
        self.limits = [
            Limit(scope, rate, size)
            for scope, rate, size in (
                ("user", settings.rate_limit_user, burst),
                ("ip", settings.rate_limit_ip, max(burst, int(settings.rate_limit_ip))),
            )
            if rate > 0
        ]

    @property
    def enabled(self) -> bool:
        return bool(self.limits)

    async def check(self, action: str, user_id: str | None, ip: str | None) -> None:
        """Take one token from each applicable bucket; RateLimited if one is empty."""
        for limit in self.limits:
            subject = user_id if limit.scope == "user" else ip
            if subject:
                await self.take(action, limit, subject)

    async def take(self, action: str, limit: Limit, subject: str) -> None:
        """Take one token from `subject`'s bucket of `action` under `limit`; RateLimited if
        it is empty (and nothing when Redis cannot answer)."""
        key = rate_limit_key(f"{action}:{limit.scope}", subject)
        try:
            allowed, wait_ms = await self.store.take_tokens(key, limit.rate, limit.burst, 1)
        except StorageError as exc:
            log.warning("rate limiter unavailable, not limiting: %s", exc)
            return
        if not allowed:
            raise RateLimited(
                f"too many {action} requests for this {limit.scope}; retry later",
                wait_ms / 1000,
            )
