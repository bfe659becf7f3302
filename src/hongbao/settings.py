"""Runtime settings, from arguments or HONGBAO_* environment variables.

Each setting says what it accepts next to its default (`Allowed`, in the field's
metadata); `Settings.from_env` refuses a value outside it with one line naming the
variable, and `settings_table` lists them all for the documentation.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hongbao.domain.splitting import MAX_SHARE_AMOUNT, SplitLimits
from hongbao.errors import ConfigurationError

ENV_PREFIX = "HONGBAO_"
#: when a grab is acknowledged (see hongbao.durability)
ACK_MODES = ("redis", "aof", "replica", "ledger")
#: the field metadata key holding a setting's `Allowed`
ALLOWED = "allowed"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Allowed:
    """What one setting accepts: numbers from `low` to `high`, one of `choices`, or text
    matching `pattern` (described by `words`)."""

    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    words: str = ""

    def describe(self) -> str:
        """What is allowed, as a README table or an error message says it."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.pattern is not None:
            return self.words
        return f"from {_number(self.low)} to {_number(self.high)}"

    def refuses(self, value: Any) -> bool:
        if self.choices:
            return value not in self.choices
        if self.pattern is not None:
            return re.fullmatch(self.pattern, str(value)) is None
        if isinstance(value, float) and not math.isfinite(value):
            return True
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        return not low <= value <= high


def between(low: float, high: float) -> dict[str, Allowed]:
    return {ALLOWED: Allowed(low, high)}


def one_of(*choices: str) -> dict[str, Allowed]:
    return {ALLOWED: Allowed(choices=choices)}


#: a Redis stream consumer name: readable in XINFO, no spaces
CONSUMER_NAME = Allowed(
    pattern=r"[A-Za-z0-9_.:@-]{0,64}",
    words="up to 64 of A-Z a-z 0-9 _ . : @ - (empty: <hostname>-<pid>)",
)

#: host names, IPv4 and bracketed IPv6 addresses, comma-separated
WEBHOOK_HOSTS = Allowed(
    pattern=r"[A-Za-z0-9_.:\[\], -]*",
    words='host names or addresses, comma-separated; ".example.com" allows its subdomains',
)

#: HONGBAO_MIN_SHARE, HONGBAO_MAX_SHARE, HONGBAO_MAX_COUNT: the fields of `SplitLimits`
SPLIT_LIMITS: dict[str, Allowed] = {
    "min_share": Allowed(1, MAX_SHARE_AMOUNT),
    "max_share": Allowed(1, MAX_SHARE_AMOUNT),
    "max_count": Allowed(1, 100_000),
}


@dataclass(frozen=True)
class Settings:
    #: redis://, rediss://, unix://, redis+sentinel://, redis+cluster:// (empty: embedded)
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: SQLAlchemy URL; plain postgresql:// / mysql:// / sqlite:// get their async driver
    database_url: str = "sqlite+aiosqlite:///hongbao.sqlite3"
    #: number of buckets (event streams); fixed for the life of a deployment
    buckets: int = field(default=16, metadata=between(1, 1024))
    split_limits: SplitLimits = field(default_factory=SplitLimits)
    #: default lifetime of a packet, seconds (at most max_expires_in)
    default_expires_in: int = field(default=86_400, metadata=between(1, 31_536_000))
    max_expires_in: int = field(default=604_800, metadata=between(1, 31_536_000))
    #: Redis keeps an expired or exhausted packet this long after its expiry (answers repeats)
    retention_seconds: int = field(default=86_400, metadata=between(0, 31_536_000))
    #: persister: entries per read of each bucket stream; a SQL transaction applies up to
    #: 4 times as many claims (SQLite: 10 times)
    persister_batch: int = field(default=1_000, metadata=between(1, 100_000))
    #: persister: transactions it applies at once, each on packets of its own (SQLite,
    #: which has one writer, always applies one)
    persister_lanes: int = field(default=2, metadata=between(1, 16))
    #: `serve --workers N` with the persister in its supervising process: how much lower
    #: the API workers' scheduling priority is (nice). When grabs fill the CPU, the
    #: persister is served first and the ledger keeps pace, at the cost of grabs/s; 0
    #: shares the CPU equally
    worker_nice: int = field(default=8, metadata=between(0, 19))
    #: how far behind the grabs the ledger may fall, seconds, before API workers pause
    #: grabs (hongbao.pace; 0: never). `serve` running its persister in-process sets 1
    #: unless this is set
    settle_lag_target: float = field(default=0.0, metadata=between(0, 3_600))
    #: persister: how long one read blocks waiting for new events, ms (0 would block
    #: forever; a read must end well within the Redis socket timeout of 5 s)
    persister_block_ms: int = field(default=200, metadata=between(1, 4_000))
    #: persister: pending entries idle this long belong to a dead consumer and are reclaimed
    persister_claim_idle_ms: int = field(default=30_000, metadata=between(100, 86_400_000))
    #: persister: an entry that failed this many deliveries goes to the dead-letter stream
    persister_max_deliveries: int = field(default=5, metadata=between(1, 1_000))
    #: persister: its consumer name in the bucket streams' group; a restarted persister
    #: takes over the entries its previous run left pending at once
    persister_consumer: str = field(default="", metadata={ALLOWED: CONSUMER_NAME})
    #: grabs per batch-script call when coalescing (1 turns coalescing off)
    coalesce_max_batch: int = field(default=512, metadata=between(1, 4_096))
    #: batch calls in flight (per bucket on a cluster) before new grabs wait to ride the next
    coalesce_max_in_flight: int = field(default=4, metadata=between(1, 1_024))
    #: sweeper: seconds between scans for expired packets
    sweep_interval: float = field(default=1.0, metadata=between(0.05, 3_600))
    #: when a grab is acknowledged: redis, aof, replica or ledger (see hongbao.durability)
    ack_mode: str = field(default="redis", metadata=one_of(*ACK_MODES))
    #: aof/replica modes: longest WAITAOF/WAIT before a grab answers 503, ms
    ack_timeout_ms: int = field(default=2_000, metadata=between(1, 60_000))
    #: ledger mode: most claims committed by one group-commit transaction
    ledger_ack_batch: int = field(default=500, metadata=between(1, 100_000))
    #: grabs and sends per second allowed per user / per client IP (0: no limit); a chat
    #: app's user grabs a few packets a second at most, while many users may share one
    #: address (a carrier's NAT, an office, the host app's backend)
    rate_limit_user: float = field(default=10.0, metadata=between(0, 1_000_000))
    rate_limit_ip: float = field(default=1_000.0, metadata=between(0, 1_000_000))
    #: a user's requests allowed in a burst above the steady rate (an address may burst
    #: one second's worth of its rate, or this, whichever is more)
    rate_limit_burst: int = field(default=20, metadata=between(1, 1_000_000))
    #: packets one sender may send per UTC day (0: no limit)
    max_sends_per_day: int = field(default=1_000, metadata=between(0, 1_000_000_000))
    #: fen one sender may send per UTC day (0: no limit); the default is 10 million yuan
    max_sent_per_day: int = field(
        default=1_000_000_000, metadata=between(0, 1_000_000_000_000_000_000)
    )
    #: webhooks: a delivery that still fails this many seconds after its event is parked
    webhook_retry_seconds: int = field(default=86_400, metadata=between(1, 2_592_000))
    #: webhooks: the longest wait between two attempts, seconds (the waits double from 1 s,
    #: each drawn between half and all of its value)
    webhook_max_backoff: float = field(default=3_600.0, metadata=between(0.01, 86_400))
    #: webhooks: how long a receiver may take to answer, seconds
    webhook_timeout: float = field(default=10.0, metadata=between(0.1, 300))
    #: webhooks: (endpoint, subject) queues one dispatcher sends at once
    webhook_concurrency: int = field(default=16, metadata=between(1, 1_024))
    #: webhooks: seconds between two looks for due deliveries when there is nothing to send
    webhook_poll_interval: float = field(default=0.25, metadata=between(0.01, 60))
    #: webhooks: the hosts endpoints may point at, comma-separated; ".example.com" allows
    #: its subdomains (empty: any host). Keeps an admin's endpoint off internal addresses
    webhook_hosts: str = field(default="", metadata={ALLOWED: WEBHOOK_HOSTS})
    #: run on a Redis whose maxmemory-policy may evict keys (it may drop a packet's
    #: keys under memory pressure): a loud warning instead of a refusal
    allow_eviction: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from HONGBAO_* variables; keyword overrides win. A value that is
        not allowed is a ConfigurationError naming its variable and what it accepts."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(env_name(f.name))
            if raw is None or f.name == "split_limits":
                continue
            values[f.name] = _convert(f.name, raw, f.type)
        values["split_limits"] = _split_limits(env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = replace(cls(), **values)
        settings.check()
        return settings

    def check(self) -> None:
        """ConfigurationError for the first setting outside what it accepts."""
        for f in fields(self):
            allowed = f.metadata.get(ALLOWED)
            value = getattr(self, f.name)
            if allowed is not None and allowed.refuses(value):
                raise ConfigurationError(
                    f"{env_name(f.name)} must be {allowed.describe()}, got {value!r}"
                )
        if self.default_expires_in > self.max_expires_in:
            raise ConfigurationError(
                f"{env_name('default_expires_in')} ({self.default_expires_in}) must not exceed "
                f"{env_name('max_expires_in')} ({self.max_expires_in})"
            )


def env_name(name: str) -> str:
    """The environment variable of a setting: HONGBAO_ and its name in capitals."""
    return ENV_PREFIX + name.upper()


def settings_table() -> list[tuple[str, str, str]]:
    """(variable, default, what it accepts) of every setting, for the documentation."""
    rows: list[tuple[str, str, str]] = []
    defaults = Settings()
    for f in fields(Settings):
        if f.name == "split_limits":
            limits = SplitLimits()
            for name, limit in SPLIT_LIMITS.items():
                rows.append((env_name(name), str(getattr(limits, name)), limit.describe()))
            continue
        allowed = f.metadata.get(ALLOWED)
        default = getattr(defaults, f.name)
        if f.name in ("redis_url", "database_url"):
            accepts = "a URL (see --help)"
        elif isinstance(default, bool):
            accepts = "1 or 0"
        else:
            accepts = allowed.describe() if allowed is not None else ""
        shown = str(int(default)) if isinstance(default, bool) else str(default) or "(empty)"
        rows.append((env_name(f.name), shown, accepts))
    return rows


def _split_limits(env: Mapping[str, str]) -> SplitLimits:
    default = SplitLimits()
    values: dict[str, int] = {}
    for name, allowed in SPLIT_LIMITS.items():
        raw = env.get(env_name(name))
        value = getattr(default, name) if raw is None else _convert(name, raw, "int")
        if allowed.refuses(value):
            raise ConfigurationError(f"{env_name(name)} must be {allowed.describe()}, got {raw!r}")
        values[name] = value
    if values["min_share"] > values["max_share"]:
        raise ConfigurationError(
            f"{env_name('min_share')} ({values['min_share']}) must not exceed "
            f"{env_name('max_share')} ({values['max_share']})"
        )
    return SplitLimits(**values)


def _convert(name: str, raw: str, kind: Any) -> Any:
    kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    text = raw.strip()
    if kind_name == "bool":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigurationError(f"{env_name(name)} must be 1 or 0, got {raw!r}")
    try:
        if kind_name == "int":
            return int(text)
        if kind_name == "float":
            return float(text)
    except ValueError:
        what = "a whole number" if kind_name == "int" else "a number"
        raise ConfigurationError(f"{env_name(name)} must be {what}, got {raw!r}") from None
    if name == "ack_mode":
        return text.lower()
    return text


def _number(value: float | None) -> str:
    if value is None:
        return "any"
    return str(int(value)) if value == int(value) else f"{value:g}"
