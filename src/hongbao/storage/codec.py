"""How hongbao's values are written inside Redis, read and written in one place.

The Lua scripts write the same forms; their headers name them:

- a **share** in a packet's shares list is one integer, ``index * 2^32 + amount``;
- a **claim** in a packet's claims hash is the text ``"seq:amount:claimed_at_ms"``;
- a **grabber** sent to grab.lua is a user id, then ``=actor`` when a service (the
  actor) grabs for the user, then ``/digests`` when the grab carries a passphrase (its
  digests, ``,``-separated; user ids hold no ``=``, ``/``, ``,`` and no space);
- an entry of a bucket's event stream is either **grants** ``{k=g, p=packet,
  c="user seq:amount:claimed_at_ms[ actor]" lines}`` (the grants of one packet in one
  script call; the actor only on grants made for a user by a service), **grouped
  grants** ``{k=m, packet=lines, packet=lines, ...}`` (the grants of the packets of one
  bucket in a script call of many packets, each packet once, its lines as in ``c``), or a
  **refund** ``{k=r, p=packet, s=sender, a=amount, n=shares left, t=closed_at_ms}``
  (a closed packet's remainder going back to its sender), with ``x=c`` when the
  packet was cancelled rather than expired.

The persister, the audit and recovery decode entries with `decode_entries`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from hongbao.domain.models import index_of, seq_of

#: a share travels as index * SHARE_PACK + amount (amounts are at most
#: domain.splitting.MAX_SHARE_AMOUNT, below 2^32 fen)
SHARE_PACK = 1 << 32
#: between a user and the actor grabbing for them, in a grabber
ACTOR_MARK = "="
#: before a grab's passphrase digests, in a grabber
ATTEMPT_MARK = "/"


def grabber(user_id: str, actor: str | None, digests: str | None = None) -> str:
    """What grab.lua is sent for one grab: the user id, with ``=actor`` when there is one,
    and ``/digests`` when the grab carries a passphrase."""
    text = user_id if actor is None else f"{user_id}{ACTOR_MARK}{actor}"
    return text if digests is None else f"{text}{ATTEMPT_MARK}{digests}"


def pack_share(index: int, amount: int) -> int:
    return index * SHARE_PACK + amount


def unpack_share(packed: int | str) -> tuple[int, int]:
    """(index, amount) of a packed share."""
    index, amount = divmod(int(packed), SHARE_PACK)
    return index, amount


class ClaimValue(NamedTuple):
    """A claim as Redis keeps it: ``"seq:amount:claimed_at_ms"`` (seq = share index + 1)."""

    seq: int
    amount: int
    claimed_at_ms: int

    @classmethod
    def of_share(cls, index: int, amount: int, claimed_at_ms: int) -> ClaimValue:
        return cls(seq_of(index), amount, claimed_at_ms)

    @classmethod
    def parse(cls, raw: str) -> ClaimValue:
        seq, amount, ms = raw.split(":")
        return cls(int(seq), int(amount), int(ms))

    @property
    def share_index(self) -> int:
        return index_of(self.seq)

    def encode(self) -> str:
        return f"{self.seq}:{self.amount}:{self.claimed_at_ms}"


@dataclass(frozen=True, slots=True)
class Grants:
    """A grants entry: the shares of one packet granted by one script call."""

    packet_id: str
    claims: list[tuple[str, ClaimValue]]
    #: user -> the actor who grabbed for them, for the grants that name one
    actors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Refund:
    """A refund entry: what a closed packet returns to its sender."""

    packet_id: str
    sender_id: str
    amount: int
    shares_left: int
    closed_at_ms: int
    #: closed by a cancel, not at its expiry
    cancelled: bool = False


StreamEntry = Grants | Refund


def _grants(packet_id: str, text: str) -> Grants:
    """A grants entry's lines: ``user claim``, or ``user claim actor``."""
    lines = [line.split(" ") for line in text.split("\n")]
    claims: list[tuple[str, ClaimValue]] = []
    actors: dict[str, str] = {}
    for parts in lines:
        if len(parts) == 2:
            claims.append((parts[0], ClaimValue.parse(parts[1])))
        elif len(parts) == 3 and parts[2]:
            claims.append((parts[0], ClaimValue.parse(parts[1])))
            actors[parts[0]] = parts[2]
        else:
            raise ValueError(f"grant lines {text!r} are not 'user claim [actor]'")
    return Grants(packet_id, claims, actors)


def decode_entries(fields: dict[str, str]) -> list[StreamEntry]:
    """The grants or refund of a stream entry's fields (several grants for a grouped
    entry, in the order of its fields); ValueError says why it is malformed.

    Kind ``c`` (one grant in fields ``u`` and ``c``) is the form older versions wrote;
    it is still read, so that a stream written before an upgrade drains after it.
    """
    try:
        kind = fields["k"]
        if kind == "g":
            grants = [_grants(fields["p"], fields["c"])]
        elif kind == "m":
            grants = [_grants(packet, text) for packet, text in fields.items() if packet != "k"]
            if not grants:
                raise ValueError("grouped grants of no packet")
        elif kind == "c":
            grants = [Grants(fields["p"], [(fields["u"], ClaimValue.parse(fields["c"]))])]
        elif kind == "r":
            refund = Refund(
                fields["p"],
                fields["s"],
                int(fields["a"]),
                int(fields["n"]),
                int(fields["t"]),
                fields.get("x") == "c",
            )
            if refund.amount < 0 or refund.shares_left < 0:
                raise ValueError("negative refund")
            return [refund]
        else:
            raise ValueError(f"unknown kind {kind!r}")
    except KeyError as missing:
        raise ValueError(f"malformed event: field {missing} missing") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"malformed event: {exc}") from None
    for granted in grants:
        for user, claim in granted.claims:
            if claim.seq < 1 or claim.amount <= 0:
                raise ValueError(
                    f"malformed event: claim {claim.encode()!r} of {user!r} has no valid share"
                )
    return [*grants]
