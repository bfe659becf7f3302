"""Value types shared by the service, the stores and the edges."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum, StrEnum
from typing import NamedTuple

from hongbao.domain.moments import from_ms


class PacketStatus(StrEnum):
    #: shares are left and the packet has not expired
    ACTIVE = "active"
    #: every share was claimed
    EXHAUSTED = "exhausted"
    #: expired with shares left; the remainder goes back to the sender
    EXPIRED = "expired"
    #: closed early by its sender (or an admin); the remainder goes back to the sender
    CANCELLED = "cancelled"


class SplitMode(StrEnum):
    #: double-mean random split (seed 000)
    LUCKY = "lucky"
    #: everyone gets the same, give or take one fen
    EQUAL = "equal"


def seq_of(index: int) -> int:
    """The 1-based number a grabber sees for share `index` (shares are numbered from 0)."""
    return index + 1


def index_of(seq: int) -> int:
    """The share index of a 1-based seq."""
    return seq - 1


class GrabStatus(IntEnum):
    """Return codes of the grab script (see storage/lua/grab.lua)."""

    #: no such packet in Redis
    UNKNOWN = 0
    #: a share was popped for this user now
    GRANTED = 1
    #: this user had claimed before; the earlier share is returned
    ALREADY_CLAIMED = 2
    #: no shares left
    EXHAUSTED = 3
    #: past expires_at by the Redis server's clock
    EXPIRED = 4
    # 5 is the script's "this packet's data is unreadable", answered as a StorageError
    #: the packet's audience does not name this user
    NOT_IN_AUDIENCE = 6
    #: the packet asks for a passphrase and the grab sent none or another
    WRONG_PASSPHRASE = 7
    #: locked out after too many wrong passphrases (the answer says for how long)
    TOO_MANY_ATTEMPTS = 8
    #: before the packet's start time (the answer says how long until it)
    NOT_STARTED = 9
    #: the packet was cancelled
    CANCELLED = 10


@dataclass(frozen=True, slots=True)
class Wallet:
    user_id: str
    balance: int


@dataclass(frozen=True, slots=True)
class Packet:
    id: str
    sender_id: str
    total_amount: int
    count: int
    mode: SplitMode
    greeting: str
    status: PacketStatus
    remaining_count: int
    remaining_amount: int
    created_at: datetime
    expires_at: datetime
    #: fen returned to the sender once the packet closed with shares left
    refunded_amount: int = 0
    #: when grabs open (None: at once); `expires_at` counts from it
    starts_at: datetime | None = None
    #: how many users the packet is for (0: anyone may grab)
    audience_size: int = 0
    #: whether a grab must carry the packet's passphrase
    passphrase: bool = False


class GrabResult(NamedTuple):
    """One user's share of a packet, as a grab answers it (a NamedTuple: immutable, and
    cheaper to build than a dataclass, once a grab)."""

    packet_id: str
    user_id: str
    amount: int
    #: 1-based number of the share this user got (share index + 1)
    seq: int
    #: False when the user had grabbed this packet before
    first: bool
    #: unix milliseconds (the datetime is made only when asked for)
    claimed_at_ms: int

    @property
    def claimed_at(self) -> datetime:
        return from_ms(self.claimed_at_ms)


@dataclass(frozen=True, slots=True)
class Claim:
    user_id: str
    amount: int
    seq: int
    claimed_at: datetime


@dataclass(frozen=True, slots=True)
class ClaimsList:
    """A page of a packet's claims in grab order, and what holds for all of them."""

    packet_id: str
    #: this page's claims
    claims: list[Claim]
    #: the largest claim once the packet is exhausted (ties: earliest grab), else None
    best_luck: str | None
    #: claims and fen claimed in the whole packet
    claimed_count: int = 0
    claimed_amount: int = 0
    #: where the next page starts (the last claim of this one), None on the last page
    next_after: ClaimPosition | None = None


class ClaimPosition(NamedTuple):
    """A claim's place in grab order: (claimed_at, seq)."""

    claimed_at_ms: int
    seq: int
