"""Runtime settings, from arguments or HONGBAO_* environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hongbao.domain.splitting import SplitLimits
from hongbao.errors import ConfigurationError

ENV_PREFIX = "HONGBAO_"


@dataclass(frozen=True)
class Settings:
    #: redis://, rediss://, redis+sentinel://, redis+cluster:// (empty: embedded server)
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: SQLAlchemy URL; plain postgresql:// / mysql:// / sqlite:// get their async driver
    database_url: str = "sqlite+aiosqlite:///hongbao.sqlite3"
    #: number of buckets (event streams); fixed for the life of a deployment
    buckets: int = 16
    split_limits: SplitLimits = field(default_factory=SplitLimits)
    #: default lifetime of a packet, seconds
    default_expires_in: int = 86_400
    max_expires_in: int = 604_800
    #: Redis keeps an expired or exhausted packet this long after its expiry (answers repeats)
    retention_seconds: int = 86_400
    #: persister: entries per read and per SQL transaction
    persister_batch: int = 1_000
    #: persister: how long one read blocks waiting for new events, ms
    persister_block_ms: int = 200
    #: persister: pending entries idle this long belong to a dead consumer and are reclaimed
    persister_claim_idle_ms: int = 30_000
    #: persister: an entry that failed this many deliveries goes to the dead-letter stream
    persister_max_deliveries: int = 5
    #: grabs per batch-script call when coalescing (1 turns coalescing off)
    coalesce_max_batch: int = 512
    #: batch calls in flight (per bucket on a cluster) before new grabs wait to ride the next
    coalesce_max_in_flight: int = 4
    #: sweeper: seconds between scans for expired packets
    sweep_interval: float = 1.0
    #: when a grab is acknowledged: redis, aof, replica or ledger (see hongbao.durability)
    ack_mode: str = "redis"
    #: aof/replica modes: longest WAITAOF/WAIT before a grab answers 503, ms
    ack_timeout_ms: int = 2_000
    #: ledger mode: most claims committed by one group-commit transaction
    ledger_ack_batch: int = 500
    #: grabs and sends per second allowed per user / per client IP (0: no limit); a chat
    #: app's user grabs a few packets a second at most, while many users may share one
    #: address (a carrier's NAT, an office, the host app's backend)
    rate_limit_user: float = 10.0
    rate_limit_ip: float = 1_000.0
    #: a user's requests allowed in a burst above the steady rate (an address may burst
    #: one second's worth of its rate, or this, whichever is more)
    rate_limit_burst: int = 20

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from HONGBAO_* variables; keyword overrides win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or f.name == "split_limits":
                continue
            values[f.name] = _convert(f.name, raw, f.type)
        default = SplitLimits()
        limits = SplitLimits(
            min_share=int(env.get("HONGBAO_MIN_SHARE", default.min_share)),
            max_share=int(env.get("HONGBAO_MAX_SHARE", default.max_share)),
            max_count=int(env.get("HONGBAO_MAX_COUNT", default.max_count)),
        )
        values["split_limits"] = limits
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)


def _convert(name: str, raw: str, kind: Any) -> Any:
    kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if kind_name == "int":
            return int(raw)
        if kind_name == "float":
            return float(raw)
    except ValueError:
        raise ConfigurationError(
            f"{ENV_PREFIX}{name.upper()} must be a number, got {raw!r}"
        ) from None
    return raw
