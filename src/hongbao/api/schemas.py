"""Request and response bodies of the HTTP API (pydantic models, strict).

Requests are validated with these models; responses are built as plain dicts on
the hot path, and the response models below exist for the OpenAPI document
(the tests check that real responses match them).
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hongbao.domain.ids import PACKET_ID_PATTERN, USER_ID_PATTERN
from hongbao.domain.models import ClaimPosition, ClaimsList, GrabResult, Packet, Wallet
from hongbao.domain.rules import MAX_AUDIENCE, MAX_PASSPHRASE
from hongbao.domain.text import GREETING_PATTERN, MAX_GREETING
from hongbao.errors import InvalidRequest

#: the most characters a passphrase may arrive in: its 32 are counted in its normal form
#: (`normal_passphrase`: NFC, no surrounding spaces), and a decomposed form (NFD, as some
#: keyboards send Hangul or accented letters) or spaces around it take more
MAX_PASSPHRASE_SENT = 4 * MAX_PASSPHRASE

#: the largest single deposit, fen (100 million yuan); keeps wallets far from BIGINT overflow
MAX_DEPOSIT = 10_000_000_000

UserId = Annotated[str, Field(pattern=USER_ID_PATTERN, examples=["alice"])]
PacketId = Annotated[str, Field(pattern=PACKET_ID_PATTERN.pattern)]
Fen = Annotated[int, Field(ge=0, description="an amount in fen (1 yuan = 100 fen)")]
#: an RFC 3339 date-time with its offset (the service parses it)
RFC3339_PATTERN = r"^\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d{1,9})?([Zz]|[+-]\d\d:\d\d)$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# -- requests ---------------------------------------------------------------------------------


class DepositRequest(_Strict):
    amount: int = Field(ge=1, le=MAX_DEPOSIT, description="fen to add to the wallet")


class SendRequest(_Strict):
    total_amount: int = Field(ge=1, description="fen to split; debited from the sender")
    count: int = Field(ge=1, description="number of shares")
    mode: Literal["lucky", "equal"] = Field(
        description="lucky: random shares; equal: the same for everyone (give or take 1 fen)"
    )
    greeting: str = Field(default="", max_length=MAX_GREETING, pattern=GREETING_PATTERN)
    expires_in: int = Field(
        default=86_400,
        ge=1,
        description="seconds until unclaimed money returns (from starts_at, when given)",
    )
    audience: list[UserId] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_AUDIENCE,
        description=(
            "the only users who may grab (one makes an exclusive packet); count may not "
            "exceed how many it names"
        ),
    )
    passphrase: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PASSPHRASE_SENT,
        description=(
            f"1 to {MAX_PASSPHRASE} characters in Unicode NFC without surrounding spaces; "
            "a grab must send it; only a keyed digest of it is kept"
        ),
    )
    starts_at: str | None = Field(
        default=None,
        pattern=RFC3339_PATTERN,
        description="RFC 3339 time grabs open, at most 7 days ahead",
        examples=["2026-11-26T20:00:00+08:00"],
    )


class GrabRequest(_Strict):
    passphrase: str | None = Field(
        default=None, max_length=MAX_PASSPHRASE_SENT, description="the packet's passphrase"
    )


# -- responses --------------------------------------------------------------------------------


class WalletOut(BaseModel):
    user_id: UserId
    balance: Fen


class PacketOut(BaseModel):
    id: PacketId
    sender_id: UserId
    total_amount: int = Field(ge=1)
    count: int = Field(ge=1)
    mode: Literal["lucky", "equal"]
    greeting: str
    status: Literal["active", "exhausted", "expired", "cancelled"]
    remaining_count: int = Field(ge=0)
    remaining_amount: Fen
    refunded_amount: Fen = Field(
        description="fen returned to the sender after the packet closed with shares left"
    )
    created_at: datetime
    expires_at: datetime
    # a packet's rules, each present only on a packet that has it
    starts_at: datetime | None = Field(
        default=None, description="when grabs open (a packet with a start time only)"
    )
    audience_size: int | None = Field(
        default=None, ge=1, description="how many users it is for (a packet with an audience)"
    )
    audience: list[UserId] | None = Field(
        default=None, description="the users it is for: shown to its sender and admins only"
    )
    for_you: bool | None = Field(
        default=None, description="whether its audience names the caller (a packet with one)"
    )
    passphrase_required: bool | None = Field(
        default=None, description="true on a packet whose grabs must send its passphrase"
    )


class GrabOut(BaseModel):
    packet_id: PacketId
    user_id: UserId
    amount: int = Field(ge=1)
    seq: int = Field(ge=1, description="1-based number of the share this user got")
    first: bool = Field(description="false when this user had grabbed this packet before")


class ClaimOut(BaseModel):
    user_id: UserId
    amount: int = Field(ge=1)
    seq: int = Field(ge=1)
    claimed_at: datetime


class ClaimsOut(BaseModel):
    packet_id: PacketId
    claims: list[ClaimOut] = Field(description="one page, in grab order")
    best_luck: UserId | None = Field(
        description="who got the largest share, once every share is taken; else null"
    )
    claimed_count: int = Field(ge=0, description="claims in the whole packet")
    claimed_amount: Fen = Field(description="fen claimed in the whole packet")
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null on the last page"
    )


class Problem(BaseModel):
    """RFC 9457 problem details, with a machine-readable `code`."""

    type: str
    title: str
    status: int = Field(ge=400, le=599)
    detail: str
    code: str
    field: str | None = Field(default=None, description="the offending field (422 only)")


class Health(BaseModel):
    status: Literal["ok", "ready"]


class RevokedOut(BaseModel):
    user_id: UserId
    revoked_until: str = Field(
        description="the user's tokens issued at or before this moment are refused"
    )


class TicketOut(BaseModel):
    ticket: str = Field(description="for ?ticket= on this packet's event stream")
    expires_in: int = Field(ge=1, description="seconds the ticket may be used to connect")


# -- the web app's JSON endpoints (hongbao.web) --------------------------------------------


#: a demo sign-in's name; the user is ``demo-<name>``
DEMO_NAME_PATTERN = r"^[A-Za-z0-9_.@-]{1,32}$"


class DemoSignIn(_Strict):
    name: str = Field(pattern=DEMO_NAME_PATTERN, examples=["alice"])


class DemoTokenOut(BaseModel):
    token: str = Field(description="a user token for the demo user `demo-<name>`")
    user_id: UserId
    balance: Fen = Field(description="the wallet after the first sign-in's demo deposit")


class AuditStatus(BaseModel):
    ok: bool | None = Field(description="null when the audit itself could not run")
    problem_count: int | None = Field(ge=0)
    problems: list[str] = Field(description="the first 20 problems")
    checked_at: str = Field(description="when the audit ran (its answer is kept ~10 s)")


class AdminStats(BaseModel):
    """The dashboard's numbers; null where the source did not answer."""

    grabs_per_second: float | None = Field(description="over the last ~10 s")
    granted_per_second: float | None
    grabs_total: dict[str, int] = Field(description="grab requests by outcome, all workers")
    backlog: int | None = Field(description="stream entries the persister has not applied")
    dead_letters: int | None
    live_packets: int | None = Field(description="open packets in the ledger (capped)")
    live_packets_capped: bool
    audit: AuditStatus
    process: int = Field(description="the id of the API process that answered")
    at: str


# -- domain -> JSON ---------------------------------------------------------------------------


def iso(moment: datetime) -> str:
    """ISO 8601 / RFC 3339 in UTC with milliseconds: 2026-02-17T08:00:00.000Z."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def wallet_json(wallet: Wallet) -> dict[str, Any]:
    return {"user_id": wallet.user_id, "balance": wallet.balance}


def packet_json(p: Packet, audience: list[str] | None = None) -> dict[str, Any]:
    """A packet's JSON; its rules' fields only when it has them, `audience` (its users)
    only for those who may see it."""
    out = {
        "id": p.id,
        "sender_id": p.sender_id,
        "total_amount": p.total_amount,
        "count": p.count,
        "mode": p.mode.value,
        "greeting": p.greeting,
        "status": p.status.value,
        "remaining_count": p.remaining_count,
        "remaining_amount": p.remaining_amount,
        "refunded_amount": p.refunded_amount,
        "created_at": iso(p.created_at),
        "expires_at": iso(p.expires_at),
    }
    if p.starts_at is not None:
        out["starts_at"] = iso(p.starts_at)
    if p.audience_size:
        out["audience_size"] = p.audience_size
        if audience is not None:
            out["audience"] = audience
    if p.passphrase:
        out["passphrase_required"] = True
    return out


def grab_json(g: GrabResult) -> dict[str, Any]:
    return {
        "packet_id": g.packet_id,
        "user_id": g.user_id,
        "amount": g.amount,
        "seq": g.seq,
        "first": g.first,
    }


def claims_json(c: ClaimsList) -> dict[str, Any]:
    return {
        "packet_id": c.packet_id,
        "claims": [
            {
                "user_id": x.user_id,
                "amount": x.amount,
                "seq": x.seq,
                "claimed_at": iso(x.claimed_at),
            }
            for x in c.claims
        ],
        "best_luck": c.best_luck,
        "claimed_count": c.claimed_count,
        "claimed_amount": c.claimed_amount,
        "next_cursor": None if c.next_after is None else claims_cursor(c.next_after),
    }


#: the largest number a cursor holds: a signed 64-bit integer, what Redis and the ledger
#: store times and ids as
MAX_CURSOR_NUMBER = 2**63 - 1


def claims_cursor(position: ClaimPosition) -> str:
    """An opaque cursor: where in grab order a page of claims ends."""
    return encode_cursor(position.claimed_at_ms, position.seq)


def claims_position(cursor: str) -> ClaimPosition:
    """The position a cursor names; InvalidRequest if it is not one `claims_cursor` made."""
    at, seq = cursor_parts(cursor, 2)
    try:
        position = ClaimPosition(int(at), int(seq))
    except ValueError:
        raise _bad_cursor() from None
    if (
        claims_cursor(position) != cursor
        or not 0 <= position.claimed_at_ms <= MAX_CURSOR_NUMBER
        or not 1 <= position.seq <= MAX_CURSOR_NUMBER
    ):
        raise _bad_cursor()
    return position


def encode_cursor(*parts: int | str) -> str:
    """An opaque cursor holding `parts` (numbers, or ids without a '.')."""
    text = ".".join(str(part) for part in parts).encode()
    return base64.urlsafe_b64encode(text).rstrip(b"=").decode()


def cursor_parts(cursor: str, count: int) -> list[str]:
    """The `count` parts of a cursor `encode_cursor` made; InvalidRequest naming the cursor
    otherwise. The caller converts the parts and checks they encode to `cursor` again."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raise _bad_cursor() from None
    parts = text.split(".")
    if len(parts) != count:
        raise _bad_cursor()
    return parts


def _bad_cursor() -> InvalidRequest:
    return InvalidRequest("cursor is not one this API returned", "cursor")
