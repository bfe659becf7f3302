"""The red-packet record, a wallet's entries and the daily statement over HTTP.

- ``GET /v1/users/{user_id}/received?year=&cursor=&limit=``: packets the user grabbed;
- ``GET /v1/users/{user_id}/sent?year=&cursor=&limit=``: packets the user sent;
- ``GET /v1/wallets/{user_id}/entries?cursor=&limit=&kind=``: the wallet's ledger entries;
- ``GET /v1/admin/statements/{date}``: every ledger entry of a UTC day and its check.

The first three may be read by the user (`may_read_history`) or an admin; the statement
by an admin. Checks run in the API's order: token (401), permission (403), then path and
query parameters (422 naming the one at fault).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hongbao.api.routes import Api, query_int
from hongbao.api.schemas import Fen, PacketId, UserId, cursor_parts, encode_cursor, iso
from hongbao.domain.history import EntriesPage, Entry, Keyset, ReceivedPage, SentPage, Statement
from hongbao.errors import Forbidden, InvalidRequest
from hongbao.history import DEFAULT_PAGE, MAX_PAGE, MAX_YEAR, MIN_YEAR
from hongbao.identity.principal import Principal
from hongbao.ledger.schema import ENTRY_KINDS

_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def may_read_history(caller: Principal, user_id: str) -> bool:
    """Who may read a user's record and wallet entries: the user, or an admin. A service
    acting for the user (X-On-Behalf-Of) is the user here: its `user_id` is theirs."""
    return caller.admin or caller.user_id == user_id


class HistoryApi:
    """The record's endpoints, on the service and token check of an `Api`."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def routes(self) -> list[Route]:
        return [
            Route("/v1/users/{user_id}/received", self.received, methods=["GET"]),
            Route("/v1/users/{user_id}/sent", self.sent, methods=["GET"]),
            Route("/v1/wallets/{user_id}/entries", self.entries, methods=["GET"]),
            Route("/v1/admin/statements/{date}", self.statement, methods=["GET"]),
        ]

    async def reader(self, request: Request) -> str:
        """The user whose record the request reads, if the caller may read it."""
        caller = await self.api.caller(request)
        user_id: str = request.path_params["user_id"]
        if not may_read_history(caller, user_id):
            raise Forbidden("a user's record can be read by the user or an admin")
        return user_id

    async def received(self, request: Request) -> Response:
        user_id = await self.reader(request)
        year, limit = _year(request), _limit(request)
        position = _position(request, "r", int, int)
        after = None if position is None else Keyset(*position)
        page = await self.api.service.history.received(user_id, year, after=after, limit=limit)
        return JSONResponse(received_json(page))

    async def sent(self, request: Request) -> Response:
        user_id = await self.reader(request)
        year, limit = _year(request), _limit(request)
        position = _position(request, "s", int, str)
        after = None if position is None else Keyset(*position)
        page = await self.api.service.history.sent(user_id, year, after=after, limit=limit)
        return JSONResponse(sent_json(page))

    async def entries(self, request: Request) -> Response:
        user_id = await self.reader(request)
        limit = _limit(request)
        kind = request.query_params.get("kind")
        position = _position(request, "e", int)
        after = None if position is None else int(position[0])
        page = await self.api.service.history.entries(user_id, kind=kind, after=after, limit=limit)
        return JSONResponse(entries_json(page))

    async def statement(self, request: Request) -> Response:
        caller = await self.api.caller(request)
        if not caller.admin:
            raise Forbidden("only an admin may read the statements")
        day = parse_day(request.path_params["date"])
        return JSONResponse(statement_json(await self.api.service.history.statement(day)))


# -- input ------------------------------------------------------------------------------------


def parse_day(text: str) -> date:
    """A YYYY-MM-DD day; InvalidRequest naming `date` otherwise."""
    try:
        if _DAY.match(text):
            return date.fromisoformat(text)
    except ValueError:
        pass
    raise InvalidRequest("date must be a day as YYYY-MM-DD, e.g. 2026-11-26", "date")


def _year(request: Request) -> int:
    return query_int(request, "year", datetime.now(UTC).year, MIN_YEAR, MAX_YEAR)


def _limit(request: Request) -> int:
    return query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)


def _position(request: Request, tag: str, *types: type) -> list[Any] | None:
    """The values in the request's `cursor` (None without one), made by `_cursor(tag, ...)`:
    a cursor of another endpoint, or one changed by hand, is a 422 naming the cursor."""
    cursor = request.query_params.get("cursor")
    if not cursor:
        return None
    parts = cursor_parts(cursor, 1 + len(types))
    try:
        values = [kind(part) for kind, part in zip(types, parts[1:], strict=True)]
    except ValueError:
        values = []
    if parts[0] != tag or not values or _cursor(tag, *values) != cursor:
        raise InvalidRequest("cursor is not one this API returned", "cursor")
    return values


def _cursor(tag: str, *values: int | str) -> str:
    return encode_cursor(tag, *values)


# -- domain -> JSON ---------------------------------------------------------------------------


def received_json(page: ReceivedPage) -> dict[str, Any]:
    after = page.next_after
    return {
        "user_id": page.user_id,
        "year": page.year,
        "as_of": iso(page.as_of),
        "totals": {
            "count": page.totals.count,
            "amount": page.totals.amount,
            "best_luck_count": page.totals.best_luck_count,
        },
        "items": [
            {
                "packet_id": r.packet_id,
                "sender_id": r.sender_id,
                "greeting": r.greeting,
                "mode": r.mode,
                "amount": r.amount,
                "claimed_at": iso(r.claimed_at),
                "best_luck": r.best_luck,
            }
            for r in page.items
        ],
        "next_cursor": None if after is None else _cursor("r", after.at_us, after.row_id),
    }


def sent_json(page: SentPage) -> dict[str, Any]:
    after = page.next_after
    return {
        "user_id": page.user_id,
        "year": page.year,
        "as_of": iso(page.as_of),
        "totals": {
            "count": page.totals.count,
            "amount": page.totals.amount,
            "refunded": page.totals.refunded,
        },
        "items": [
            {
                "packet_id": p.packet_id,
                "greeting": p.greeting,
                "mode": p.mode,
                "total_amount": p.total_amount,
                "count": p.count,
                "claimed_count": p.claimed_count,
                "claimed_amount": p.claimed_amount,
                "refunded_amount": p.refunded_amount,
                "status": p.status,
                "created_at": iso(p.created_at),
                "expires_at": iso(p.expires_at),
            }
            for p in page.items
        ],
        "next_cursor": None if after is None else _cursor("s", after.at_us, after.row_id),
    }


def entries_json(page: EntriesPage) -> dict[str, Any]:
    return {
        "user_id": page.user_id,
        "balance": page.balance,
        "as_of": iso(page.as_of),
        "items": [entry_json(e) for e in page.items],
        "next_cursor": None if page.next_after is None else _cursor("e", page.next_after),
    }


#: kinds of entries a withdrawal makes; their reference is "<kind>:<withdrawal id>"
WITHDRAWAL_KINDS = ("withdrawal", "reversal")


def entry_json(e: Entry) -> dict[str, Any]:
    """An entry; a withdrawal's debit or reversal also names its withdrawal."""
    out = {
        "reference": e.reference,
        "kind": e.kind,
        "amount": e.amount,
        "packet_id": e.packet_id,
        "created_at": iso(e.created_at),
        "balance_after": e.balance_after,
    }
    if e.kind in WITHDRAWAL_KINDS:
        out["withdrawal_id"] = e.reference.partition(":")[2]
    return out


def statement_json(st: Statement) -> dict[str, Any]:
    """The statement as JSON: the body of the endpoint and of ``hongbao statement``."""
    return {
        "date": st.day.isoformat(),
        "as_of": iso(st.as_of),
        "entries": [
            {
                "reference": x.reference,
                "wallet": x.user_id,
                "kind": x.kind,
                "amount": x.amount,
                "packet": x.packet_id,
                "time": iso_micros(x.created_at),
            }
            for x in st.lines
        ],
        "totals": [{"kind": k.kind, "count": k.count, "amount": k.amount} for k in st.by_kind],
        "start_balance": st.start,
        "entries_total": st.entries,
        "end_balance": st.end,
        "balanced": st.balanced,
        "difference": st.difference,
        "wallets_off": [
            {"wallet": w.user_id, "start": w.start, "entries": w.entries, "end": w.end}
            for w in st.wallets_off
        ],
    }


def iso_micros(moment: datetime) -> str:
    """UTC ISO 8601 with the ledger's microseconds, for matching entries one by one."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- the OpenAPI document's models ------------------------------------------------------------


class ReceivedTotalsOut(BaseModel):
    count: int = Field(ge=0, description="packets grabbed in the year")
    amount: Fen = Field(description="fen grabbed in the year")
    best_luck_count: int = Field(
        ge=0, description="finished lucky packets in which the user got the largest share"
    )


class ReceivedItemOut(BaseModel):
    packet_id: PacketId
    sender_id: UserId
    greeting: str
    mode: Literal["lucky", "equal"]
    amount: int = Field(ge=1, description="the user's share, fen")
    claimed_at: datetime
    best_luck: bool = Field(
        description="the largest share of a finished lucky packet (ties: the earliest grab)"
    )


class ReceivedOut(BaseModel):
    user_id: UserId
    year: int = Field(ge=MIN_YEAR, le=MAX_YEAR)
    as_of: datetime = Field(
        description="the ledger's clock at the read: grabs the ledger holds by then are in"
    )
    totals: ReceivedTotalsOut
    items: list[ReceivedItemOut] = Field(description="one page, newest first")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


class SentTotalsOut(BaseModel):
    count: int = Field(ge=0, description="packets sent in the year")
    amount: Fen = Field(description="fen put into them")
    refunded: Fen = Field(description="fen that came back unclaimed")


class SentItemOut(BaseModel):
    packet_id: PacketId
    greeting: str
    mode: Literal["lucky", "equal"]
    total_amount: int = Field(ge=1)
    count: int = Field(ge=1)
    claimed_count: int = Field(ge=0)
    claimed_amount: Fen
    refunded_amount: Fen
    status: Literal["active", "exhausted", "expired"] = Field(
        description="as the ledger has it: `active` until every share is taken or the "
        "expired packet's remainder is refunded"
    )
    created_at: datetime
    expires_at: datetime


class SentOut(BaseModel):
    user_id: UserId
    year: int = Field(ge=MIN_YEAR, le=MAX_YEAR)
    as_of: datetime
    totals: SentTotalsOut
    items: list[SentItemOut] = Field(description="one page, newest first")
    next_cursor: str | None


class EntryOut(BaseModel):
    reference: str = Field(description="unique per entry: what it applied")
    kind: str = Field(json_schema_extra={"enum": list(ENTRY_KINDS)})
    amount: int = Field(description="signed fen: credits positive, debits negative")
    packet_id: PacketId | None
    created_at: datetime
    balance_after: int = Field(description="the wallet's balance right after this entry")
    withdrawal_id: str | None = Field(
        default=None,
        description="the withdrawal of a `withdrawal` (its debit) or `reversal` (its money "
        "back after it failed) entry; absent on other entries",
    )


class EntriesOut(BaseModel):
    user_id: UserId
    balance: Fen = Field(description="the balance, read with the entries")
    as_of: datetime
    items: list[EntryOut] = Field(description="one page, newest first")
    next_cursor: str | None


class StatementLineOut(BaseModel):
    reference: str
    wallet: UserId
    kind: str = Field(json_schema_extra={"enum": list(ENTRY_KINDS)})
    amount: int
    packet: PacketId | None
    time: datetime = Field(description="when the entry was written, with microseconds")


class KindTotalOut(BaseModel):
    kind: str = Field(json_schema_extra={"enum": list(ENTRY_KINDS)})
    count: int = Field(ge=1)
    amount: int


class WalletOffOut(BaseModel):
    wallet: UserId
    start: int
    entries: int
    end: int


class StatementOut(BaseModel):
    date: str = Field(pattern=_DAY.pattern, examples=["2026-11-26"])
    as_of: datetime
    entries: list[StatementLineOut] = Field(description="the day's entries, oldest first")
    totals: list[KindTotalOut] = Field(description="per kind of entry")
    start_balance: int = Field(description="the wallets when the day began: every entry before it")
    entries_total: int
    end_balance: int = Field(
        description="the wallets when the day ended: their balances now minus every entry after"
    )
    balanced: bool = Field(description="start + entries = end, in total and for every wallet")
    difference: int = Field(description="end - (start + entries)")
    wallets_off: list[WalletOffOut] = Field(description="the wallets that do not add up")


#: the models the OpenAPI document describes these endpoints with
MODELS: list[type[BaseModel]] = [ReceivedOut, SentOut, EntriesOut, StatementOut]
