"""The service's side of packet rules: a send's rules checked and digested, a grab's
passphrase digested, and the answers of grabs the rules turned away.

The rules themselves are data of the packet (hongbao.domain.rules): the ledger keeps
them with the packet, Redis in the packet's own keys, and grab.lua checks them in the
same atomic step as the grab.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hongbao.domain.models import GrabStatus
from hongbao.domain.rules import (
    NO_RULES,
    PacketRules,
    normal_passphrase,
    passphrase_digest,
    request_digest,
    require_audience,
    require_passphrase,
    require_start,
)
from hongbao.errors import (
    ConfigurationError,
    HongbaoError,
    InvalidRequest,
    NotInAudience,
    NotStarted,
    PacketCancelled,
    TooManyAttempts,
    WrongPassphrase,
)

#: cancel.lua's answers
CANCELLED_NOW, CANCELLED_BEFORE, CLOSED_AT_EXPIRY, EXPIRED, EXHAUSTED = 1, 2, 3, 4, 5
NOT_IN_REDIS = 0


@dataclass(frozen=True, slots=True)
class RuleRequest:
    """A send's rules, checked, before the packet has an id."""

    audience: tuple[str, ...] = ()
    #: the passphrase's normal form
    passphrase: str | None = None
    #: the start time asked for, and the one kept (None: the packet opens at once)
    asked_start: datetime | None = None
    starts_at: datetime | None = None

    def request_part(self, keys: Sequence[bytes]) -> list[Any]:
        """What stands for the rules in the send's request hash (an idempotent retry must
        ask for the same): the passphrase only as a keyed digest."""
        if not (self.audience or self.passphrase or self.asked_start):
            return []
        phrase = None if self.passphrase is None else request_digest(keys[0], self.passphrase)
        start = None if self.asked_start is None else self.asked_start.isoformat()
        return [sorted(self.audience), phrase, start]

    def for_packet(self, packet_id: str, keys: Sequence[bytes]) -> PacketRules:
        digest = None
        if self.passphrase is not None:
            digest = passphrase_digest(keys[0], packet_id, self.passphrase)
        if not (self.audience or digest or self.starts_at):
            return NO_RULES
        return PacketRules(self.audience, len(self.audience), digest, self.starts_at)


def rule_request(
    count: int,
    now: datetime,
    keys: Sequence[bytes],
    audience: Sequence[str] | None,
    passphrase: str | None,
    starts_at: datetime | None,
) -> RuleRequest:
    """A send's rules, checked (InvalidRequest naming the field); `keys` are the service's
    passphrase keys (a passphrase needs one)."""
    users = () if audience is None else require_audience(audience, count)
    phrase = None if passphrase is None else require_passphrase(passphrase)
    if phrase is not None and not keys:
        raise ConfigurationError(
            "passphrases need a passphrase key: Hongbao(..., passphrase_keys=[key])"
        )
    start = None if starts_at is None else require_start(starts_at, now)
    return RuleRequest(users, phrase, starts_at, start)


def grab_digests(keys: Sequence[bytes], packet_id: str, passphrase: object) -> str | None:
    """What a grab sends grab.lua for its passphrase: its digest under each key (the
    current one first), ``,``-joined; None for no passphrase (or an empty one)."""
    if passphrase is None:
        return None
    if not isinstance(passphrase, str):
        raise InvalidRequest("passphrase must be text", "passphrase")
    text = normal_passphrase(passphrase)
    if not text or not keys:
        return None
    return ",".join(passphrase_digest(key, packet_id, text) for key in keys)


def rule_refusal(packet_id: str, status: GrabStatus, wait_ms: int) -> HongbaoError | None:
    """The error of a grab the packet's rules turned away; None for other statuses."""
    if status is GrabStatus.NOT_IN_AUDIENCE:
        return NotInAudience(f"packet {packet_id} is for other users")
    if status is GrabStatus.WRONG_PASSPHRASE:
        return WrongPassphrase(f"packet {packet_id} needs its passphrase")
    if status is GrabStatus.TOO_MANY_ATTEMPTS:
        return TooManyAttempts(
            f"too many wrong passphrases for packet {packet_id}: try again later", wait_ms / 1000
        )
    if status is GrabStatus.NOT_STARTED:
        return NotStarted(f"packet {packet_id} opens later", wait_ms / 1000)
    if status is GrabStatus.CANCELLED:
        return PacketCancelled(f"packet {packet_id} was cancelled")
    return None
