"""Withdrawals over HTTP: money out of a wallet, paid by the host's payment system.

- ``POST /v1/wallets/{user_id}/withdrawals`` (``Idempotency-Key`` required): the owner,
  a service acting for them (X-On-Behalf-Of) or an admin; debits the wallet at once;
- ``GET /v1/wallets/{user_id}/withdrawals?status=&limit=&cursor=``: the same callers;
- ``GET /v1/withdrawals?status=&older_than=&limit=&cursor=``: an admin; every user's
  withdrawals in one status (default ``requested``: the payouts in flight), oldest first;
- ``GET /v1/withdrawals/{withdrawal_id}``: its owner, a service or an admin (anyone else
  gets the 404 of an unknown id);
- ``POST /v1/withdrawals/{withdrawal_id}/complete`` and ``/fail``, with an optional
  ``{"note": ...}``: a service (its own token, not acting for a user) or an admin, as the
  payment system reports the payout; a failed withdrawal's money goes back, once.

Checks run in the API's order: token (401), permission (403), path and query parameters
and headers, then the body (413, 415, 422).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hongbao.api.routes import (
    IDEMPOTENCY_KEY_PATTERN,
    Api,
    has_body,
    query_int,
    read_json,
    route_by_method,
)
from hongbao.api.schemas import UserId, cursor_parts, encode_cursor, iso
from hongbao.domain.ids import valid_user_id
from hongbao.domain.text import GREETING_PATTERN
from hongbao.domain.withdrawals import (
    MAX_NOTE,
    MAX_WITHDRAWAL,
    WITHDRAWAL_ID_PATTERN,
    StatusPage,
    Withdrawal,
    WithdrawalPosition,
    WithdrawalsPage,
    WithdrawalStatus,
)
from hongbao.errors import Forbidden, InvalidRequest, WithdrawalNotFound
from hongbao.history import LAST_MICROS
from hongbao.identity.principal import Principal
from hongbao.withdrawals import DEFAULT_PAGE, MAX_OLDER_THAN, MAX_PAGE, MAX_STATUS_PAGE

_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
#: the tags of the list cursors, a user's list and a status's (a cursor of another list
#: is refused: the two run in opposite orders)
_CURSOR_TAG = "w"
_STATUS_CURSOR_TAG = "ws"


class WithdrawalsApi:
    """The withdrawals' endpoints, on the service and token check of an `Api`."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def routes(self) -> list[Route]:
        return [
            # one route for both methods: a 405 on the path then allows both
            route_by_method(
                "/v1/wallets/{user_id}/withdrawals", {"GET": self.of_user, "POST": self.request}
            ),
            Route("/v1/withdrawals", self.in_status, methods=["GET"]),
            Route("/v1/withdrawals/{withdrawal_id}", self.get, methods=["GET"]),
            Route("/v1/withdrawals/{withdrawal_id}/complete", self.complete, methods=["POST"]),
            Route("/v1/withdrawals/{withdrawal_id}/fail", self.fail, methods=["POST"]),
        ]

    async def owner(self, request: Request) -> tuple[Principal, str]:
        """The caller and the wallet's user, if the caller may act on that wallet."""
        caller = await self.api.caller(request)
        user_id: str = request.path_params["user_id"]
        if caller.user_id != user_id and not caller.admin:
            raise Forbidden(
                "a wallet's withdrawals are for its owner, a service acting for them "
                "(X-On-Behalf-Of) or an admin"
            )
        if not valid_user_id(user_id):
            raise InvalidRequest(
                "user_id must be 1-64 characters of letters, digits and _ . : @ -", "user_id"
            )
        return caller, user_id

    async def request(self, request: Request) -> Response:
        caller, user_id = await self.owner(request)
        key = request.headers.get("idempotency-key")
        if key is None or not _IDEMPOTENCY_KEY.match(key):
            raise InvalidRequest(
                "a withdrawal needs an Idempotency-Key of 1 to 128 visible ASCII characters",
                "Idempotency-Key",
            )
        body = await read_json(request, WithdrawalRequest)
        # who asked for the user: the service acting for them, or an admin
        actor = caller.actor or (caller.user_id if caller.user_id != user_id else None)
        withdrawal, _ = await self.api.service.withdrawals.request(
            user_id, body.amount, key, actor=actor
        )
        return JSONResponse(withdrawal_json(withdrawal), status_code=201)

    async def of_user(self, request: Request) -> Response:
        _, user_id = await self.owner(request)
        status = request.query_params.get("status")
        limit = query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        cursor = request.query_params.get("cursor")
        page = await self.api.service.withdrawals.of_user(
            user_id,
            status=status,
            after=withdrawal_position(cursor) if cursor else None,
            limit=limit,
        )
        return JSONResponse(withdrawals_json(page))

    async def in_status(self, request: Request) -> Response:
        """Every user's withdrawals in one status, oldest first (admin only): by default
        the requested ones, whose outcome the payment system has not reported."""
        caller = await self.api.caller(request)
        if not caller.admin:
            raise Forbidden("only an admin may list the withdrawals of every user")
        params = request.query_params
        status = params.get("status", WithdrawalStatus.REQUESTED.value)
        older_than = None
        if "older_than" in params:
            older_than = query_int(request, "older_than", 0, 0, MAX_OLDER_THAN)
        limit = query_int(request, "limit", DEFAULT_PAGE, 1, MAX_STATUS_PAGE)
        cursor = params.get("cursor")
        page = await self.api.service.withdrawals.in_status(
            status,
            older_than=older_than,
            after=withdrawal_position(cursor, _STATUS_CURSOR_TAG) if cursor else None,
            limit=limit,
        )
        return JSONResponse(status_page_json(page))

    async def get(self, request: Request) -> Response:
        """The withdrawal, for an admin, a service or its owner. Anyone else gets the 404
        of an unknown id: which ids exist is not theirs to learn."""
        caller = await self.api.caller(request)
        withdrawal_id: str = request.path_params["withdrawal_id"]
        withdrawal = await self.api.service.withdrawals.get(withdrawal_id)
        if not (caller.admin or caller.service or caller.user_id == withdrawal.user_id):
            raise WithdrawalNotFound(f"no withdrawal {withdrawal_id}")
        return JSONResponse(withdrawal_json(withdrawal))

    async def complete(self, request: Request) -> Response:
        caller, note = await self.outcome(request)
        withdrawal, _ = await self.api.service.withdrawals.complete(
            request.path_params["withdrawal_id"], note, actor=caller.user_id
        )
        return JSONResponse(withdrawal_json(withdrawal))

    async def fail(self, request: Request) -> Response:
        caller, note = await self.outcome(request)
        withdrawal, _ = await self.api.service.withdrawals.fail(
            request.path_params["withdrawal_id"], note, actor=caller.user_id
        )
        return JSONResponse(withdrawal_json(withdrawal))

    async def outcome(self, request: Request) -> tuple[Principal, str | None]:
        """The caller reporting an outcome, if it may, and the body's note (None without a
        body)."""
        caller = await self.api.caller(request)
        if not (caller.service or caller.admin):
            raise Forbidden("only a service or an admin may report a withdrawal's outcome")
        headers = request.headers
        if not has_body(headers.get("content-length"), headers.get("transfer-encoding")):
            return caller, None
        return caller, (await read_json(request, OutcomeRequest)).note


# -- cursors ----------------------------------------------------------------------------------


def withdrawal_cursor(position: WithdrawalPosition, tag: str = _CURSOR_TAG) -> str:
    """The cursor of a position in the list `tag` names (default: a user's list)."""
    return encode_cursor(tag, position.at_us, position.id)


def withdrawal_position(cursor: str, tag: str = _CURSOR_TAG) -> WithdrawalPosition:
    """The position a cursor names; InvalidRequest if `withdrawal_cursor` did not make it
    for the list `tag` names."""
    found, at, withdrawal_id = cursor_parts(cursor, 3)
    try:
        position = WithdrawalPosition(int(at), withdrawal_id)
    except ValueError:
        position = None
    if (
        found != tag
        or position is None
        or not 0 <= position.at_us <= LAST_MICROS  # a time the ledger's datetimes can hold
        or not WITHDRAWAL_ID_PATTERN.fullmatch(withdrawal_id)
        or withdrawal_cursor(position, tag) != cursor
    ):
        raise InvalidRequest("cursor is not one this API returned", "cursor")
    return position


# -- domain -> JSON ---------------------------------------------------------------------------


def withdrawal_json(w: Withdrawal) -> dict[str, Any]:
    return {
        "id": w.id,
        "user_id": w.user_id,
        "amount": w.amount,
        "status": w.status.value,
        "note": w.note,
        "created_at": iso(w.created_at),
        "updated_at": iso(w.updated_at),
    }


def withdrawals_json(page: WithdrawalsPage) -> dict[str, Any]:
    after = page.next_after
    return {
        "user_id": page.user_id,
        "items": [withdrawal_json(w) for w in page.items],
        "next_cursor": None if after is None else withdrawal_cursor(after),
    }


def status_page_json(page: StatusPage) -> dict[str, Any]:
    after = page.next_after
    return {
        "status": page.status.value,
        "items": [withdrawal_json(w) for w in page.items],
        "next_cursor": None if after is None else withdrawal_cursor(after, _STATUS_CURSOR_TAG),
    }


# -- bodies and the OpenAPI document's models -------------------------------------------------


class WithdrawalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    amount: int = Field(ge=1, le=MAX_WITHDRAWAL, description="fen to take out of the wallet")


class OutcomeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    note: str | None = Field(
        default=None,
        max_length=MAX_NOTE,
        pattern=GREETING_PATTERN,
        description="the payment system's reference on completion, or why it failed",
    )


class WithdrawalOut(BaseModel):
    id: str = Field(pattern=WITHDRAWAL_ID_PATTERN.pattern)
    user_id: UserId
    amount: int = Field(ge=1, description="fen debited from the wallet")
    status: Literal["requested", "completed", "failed"] = Field(
        description="requested: debited, the payout under way; completed: paid out; "
        "failed: not paid, the money back in the wallet"
    )
    note: str | None = Field(description="what the payment system said of the outcome")
    created_at: datetime
    updated_at: datetime = Field(description="when the status last changed")


class WithdrawalsOut(BaseModel):
    user_id: UserId
    items: list[WithdrawalOut] = Field(description="one page, newest first")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


class WithdrawalsInStatusOut(BaseModel):
    status: Literal["requested", "completed", "failed"] = Field(
        description="the state every withdrawal of the list is in"
    )
    items: list[WithdrawalOut] = Field(
        description="one page, oldest first (by the time requested, then id)"
    )
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


#: the models the OpenAPI document describes these endpoints with
MODELS: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
    (WithdrawalRequest, "validation"),
    (OutcomeRequest, "validation"),
    (WithdrawalOut, "serialization"),
    (WithdrawalsOut, "serialization"),
    (WithdrawalsInStatusOut, "serialization"),
]
#: the states a list may be narrowed to (?status=)
STATES = [s.value for s in WithdrawalStatus]
