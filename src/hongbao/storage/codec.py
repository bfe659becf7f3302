"""How hongbao's values are written inside Redis, read and written in one place.

The Lua scripts write the same forms; their headers name them:

- a **share** in a packet's shares list is one integer, ``index * 2^32 + amount``;
- a **claim** in a packet's claims hash is the text ``"seq:amount:claimed_at_ms"``;
- an entry of a bucket's event stream is either **grants** ``{k=g, p=packet,
  c="user seq:amount:claimed_at_ms" lines}`` (the grants of one packet in one script
  call) or a **refund** ``{k=r, p=packet, s=sender, a=amount, n=shares left,
  t=closed_at_ms}`` (a closed packet's remainder going back to its sender).

The persister, the audit and recovery decode entries with `decode_entry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hongbao.domain.models import index_of, seq_of

#: a share travels as index * SHARE_PACK + amount (amounts stay below 2^32 fen)
SHARE_PACK = 1 << 32


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


@dataclass(frozen=True, slots=True)
class Refund:
    """A refund entry: what a closed packet returns to its sender."""

    packet_id: str
    sender_id: str
    amount: int
    shares_left: int
    closed_at_ms: int


StreamEntry = Grants | Refund


def decode_entry(fields: dict[str, str]) -> StreamEntry:
    """The grants or refund of a stream entry's fields; ValueError says why it is malformed.

    Kind ``c`` (one grant in fields ``u`` and ``c``) is the form older versions wrote;
    it is still read, so that a stream written before an upgrade drains after it.
    """
    try:
        kind = fields["k"]
        if kind == "g":
            pairs = [line.split(" ") for line in fields["c"].split("\n")]
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError(f"grant lines {fields['c']!r} are not 'user claim'")
            grants = Grants(fields["p"], [(u, ClaimValue.parse(c)) for u, c in pairs])
        elif kind == "c":
            grants = Grants(fields["p"], [(fields["u"], ClaimValue.parse(fields["c"]))])
        elif kind == "r":
            refund = Refund(
                fields["p"], fields["s"], int(fields["a"]), int(fields["n"]), int(fields["t"])
            )
            if refund.amount < 0 or refund.shares_left < 0:
                raise ValueError("negative refund")
            return refund
        else:
            raise ValueError(f"unknown kind {kind!r}")
    except KeyError as missing:
        raise ValueError(f"malformed event: field {missing} missing") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"malformed event: {exc}") from None
    for user, claim in grants.claims:
        if claim.seq < 1 or claim.amount <= 0:
            raise ValueError(
                f"malformed event: claim {claim.encode()!r} of {user!r} has no valid share"
            )
    return grants
