"""Rules a sender puts on a packet (who may grab, a passphrase, a start time) and the
limits on what one sender sends in a day. Pure: checks, normal forms and digests.

- **audience**: 1 to MAX_AUDIENCE user ids; only they may grab (one id makes an
  exclusive packet, 专属红包). Repeated ids count once.
- **passphrase** (口令): 1 to MAX_PASSPHRASE characters. Only its digest is kept: HMAC-SHA256
  under a key derived from the deployment's secret, over the packet id and the
  passphrase (`passphrase_digest`). The packet id salts it, the key keeps anyone who
  reads Redis or SQL without the secret from testing guesses offline, and a grab
  compares digests inside the grab script, so the check cannot be raced.
- **starts_at**: grabs open then (at most MAX_START_AHEAD ahead); the lifetime counts
  from it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from hongbao.domain.ids import require_user_id
from hongbao.domain.text import GREETING_FORBIDDEN
from hongbao.errors import InvalidRequest

MAX_AUDIENCE = 1_000
MAX_PASSPHRASE = 32
#: the furthest ahead a start time may be
MAX_START_AHEAD = timedelta(days=7)
#: wrong passphrases a user may send for one packet before being locked out of it
WRONG_TRIES = 5
#: how long the lockout lasts, seconds
LOCKOUT_SECONDS = 600
#: the digest's length (hex of SHA-256)
DIGEST_LENGTH = 64

_FORBIDDEN = re.compile(f"[{GREETING_FORBIDDEN}\\n\\r\\t]")
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d{1,9})?([Zz]|[+-]\d\d:\d\d)")


@dataclass(frozen=True, slots=True)
class PacketRules:
    """A packet's rules. `audience` may be left out (`audience_size` still says how many
    it names) where only the summary is needed."""

    audience: tuple[str, ...] = ()
    audience_size: int = 0
    #: `passphrase_digest` of the packet's passphrase, None without one
    passphrase_hash: str | None = None
    starts_at: datetime | None = None

    @property
    def any(self) -> bool:
        return bool(self.audience_size or self.passphrase_hash or self.starts_at)

    def summary(self) -> PacketRules:
        """The same rules without the list of users (cheap to keep)."""
        return PacketRules((), self.audience_size, self.passphrase_hash, self.starts_at)


NO_RULES = PacketRules()


@dataclass(frozen=True, slots=True)
class SendLimits:
    """What one sender may send in a UTC day: packets and fen (0: no limit)."""

    sends: int
    amount: int

    @property
    def any(self) -> bool:
        return bool(self.sends or self.amount)


def require_audience(audience: object, count: int) -> tuple[str, ...]:
    """The audience's distinct user ids in the order given; InvalidRequest (field
    ``audience``) unless it is a list of 1 to MAX_AUDIENCE valid ids naming at least
    `count` users (a share for each at most)."""
    if isinstance(audience, str | bytes) or not isinstance(audience, Sequence):
        raise InvalidRequest("audience must be a list of user ids", "audience")
    if not 1 <= len(audience) <= MAX_AUDIENCE:
        raise InvalidRequest(f"audience must name 1 to {MAX_AUDIENCE} users", "audience")
    users = tuple(dict.fromkeys(require_user_id(u, "audience") for u in audience))
    if count > len(users):
        raise InvalidRequest(
            f"count ({count}) may not exceed the audience's {len(users)} users", "count"
        )
    return users


def normal_passphrase(text: str) -> str:
    """The form a passphrase is compared in: NFC (the same characters typed on different
    keyboards compare equal), without surrounding spaces."""
    return unicodedata.normalize("NFC", text).strip()


def require_passphrase(passphrase: object) -> str:
    """The normal form of a sender's passphrase; InvalidRequest (field ``passphrase``)
    unless it is 1 to MAX_PASSPHRASE characters without control characters."""
    if not isinstance(passphrase, str):
        raise InvalidRequest("passphrase must be text", "passphrase")
    text = normal_passphrase(passphrase)
    if not 1 <= len(text) <= MAX_PASSPHRASE or _FORBIDDEN.search(text):
        raise InvalidRequest(
            f"passphrase must be 1 to {MAX_PASSPHRASE} characters, without control characters",
            "passphrase",
        )
    return text


def passphrase_digest(key: bytes, packet_id: str, passphrase: str) -> str:
    """HMAC-SHA256 (hex) under `key` of the packet id and the passphrase's normal form:
    what Redis and SQL keep, and what a grab sends the script to compare."""
    message = f"{packet_id}\n{normal_passphrase(passphrase)}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def request_digest(key: bytes, passphrase: str) -> str:
    """A keyed digest of a passphrase alone: it stands for the passphrase in a send's
    request hash (an idempotent retry has no packet id yet to salt it with)."""
    return hmac.new(key, normal_passphrase(passphrase).encode(), hashlib.sha256).hexdigest()


def require_start(starts_at: object, now: datetime) -> datetime | None:
    """The start time to keep: None when it is not after `now` (the packet opens at once);
    InvalidRequest (field ``starts_at``) unless an aware time at most MAX_START_AHEAD on."""
    if not isinstance(starts_at, datetime) or starts_at.tzinfo is None:
        raise InvalidRequest("starts_at must be an RFC 3339 time with its offset", "starts_at")
    if starts_at <= now:
        return None
    if starts_at - now > MAX_START_AHEAD:
        raise InvalidRequest(
            f"starts_at may be at most {MAX_START_AHEAD.days} days ahead", "starts_at"
        )
    return starts_at.astimezone(UTC)


def parse_time(text: str, field: str) -> datetime:
    """An RFC 3339 date-time (``2026-11-26T20:00:00+08:00``, ``…Z``); InvalidRequest
    naming `field` for anything else, a time without an offset included."""
    if not _RFC3339.fullmatch(text):
        raise InvalidRequest(f"{field} must be an RFC 3339 time with its offset", field)
    if text.endswith("z"):  # RFC 3339 allows a lower-case z; fromisoformat does not
        text = text[:-1] + "Z"
    try:
        # fromisoformat takes at most microseconds: cut longer fractions
        head, dot, rest = text.partition(".")
        if dot:
            digits = re.match(r"\d+", rest)
            assert digits is not None
            rest = digits.group()[:6] + rest[digits.end() :]
        return datetime.fromisoformat(head + dot + rest)
    except ValueError:
        raise InvalidRequest(f"{field} is not a valid time", field) from None


def utc_day(moment: datetime) -> date:
    """The UTC day a moment falls on (sender limits count per UTC day)."""
    return moment.astimezone(UTC).date()


def next_utc_day(moment: datetime) -> datetime:
    """The start of the UTC day after `moment`'s: when a day's sender limits reset."""
    day = utc_day(moment) + timedelta(days=1)
    return datetime(day.year, day.month, day.day, tzinfo=UTC)
