"""The OpenAPI document's paths of the red-packet record and statements, of withdrawals
and of webhooks (their routes: api/history.py, api/withdrawals.py, api/webhooks.py)."""

from __future__ import annotations

from typing import Any

from hongbao.api.openapi_ops import body, operation, path_param, problem, problems
from hongbao.api.withdrawals import STATES as WITHDRAWAL_STATES
from hongbao.domain.withdrawals import WITHDRAWAL_ID_PATTERN
from hongbao.history import DEFAULT_PAGE, MAX_PAGE, MAX_YEAR, MIN_YEAR
from hongbao.ledger.schema import ENTRY_KINDS
from hongbao.withdrawals import DEFAULT_PAGE as DEFAULT_WITHDRAWALS_PAGE
from hongbao.withdrawals import MAX_OLDER_THAN, MAX_STATUS_PAGE
from hongbao.withdrawals import MAX_PAGE as MAX_WITHDRAWALS_PAGE


def history_paths(user: dict[str, Any]) -> dict[str, Any]:
    """The red-packet record, a wallet's entries and the daily statement (api/history.py)."""

    def query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "in": "query",
            "required": False,
            "description": description,
            "schema": schema,
        }

    year = query(
        "year",
        "the UTC year (default: this year)",
        {"type": "integer", "minimum": MIN_YEAR, "maximum": MAX_YEAR},
    )
    limit = query(
        "limit",
        "rows in the page",
        {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_PAGE,
            "default": DEFAULT_PAGE,
        },
    )
    cursor = query(
        "cursor",
        "the `next_cursor` of the previous page (empty: the first page)",
        {"type": "string"},
    )
    kind = query("kind", "only entries of this kind", {"type": "string", "enum": list(ENTRY_KINDS)})
    day = path_param("date", {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"})
    return {
        "/v1/users/{user_id}/received": {
            "get": operation(
                "getReceived",
                "Packets the user grabbed in a year, newest first, with the year's totals "
                "(the user or an admin)",
                [user, year, limit, cursor],
                None,
                200,
                "ReceivedOut",
                [401, 403, 422, 503],
            )
        },
        "/v1/users/{user_id}/sent": {
            "get": operation(
                "getSent",
                "Packets the user sent in a year, newest first, with the year's totals "
                "(the user or an admin)",
                [user, year, limit, cursor],
                None,
                200,
                "SentOut",
                [401, 403, 422, 503],
            )
        },
        "/v1/wallets/{user_id}/entries": {
            "get": operation(
                "getEntries",
                "A wallet's ledger entries, newest first, each with the balance after it "
                "(its owner or an admin)",
                [user, limit, cursor, kind],
                None,
                200,
                "EntriesOut",
                [401, 403, 422, 503],
            )
        },
        "/v1/admin/statements/{date}": {
            "get": operation(
                "getStatement",
                "Every ledger entry of a UTC day, per-kind totals and the check that the "
                "wallets at its start plus its entries make those at its end (admin only)",
                [day],
                None,
                200,
                "StatementOut",
                [401, 403, 422, 503],
            )
        },
    }


def withdrawal_paths(
    user: dict[str, Any], idempotency: dict[str, Any], behalf: dict[str, Any]
) -> dict[str, Any]:
    """Money out of a wallet, paid by the host's payment system (api/withdrawals.py)."""
    withdrawal = path_param(
        "withdrawal_id", {"type": "string", "pattern": WITHDRAWAL_ID_PATTERN.pattern}
    )
    key = {
        **idempotency,
        "required": True,
        "description": "the same key again answers the same withdrawal, debited once",
    }
    state: dict[str, Any] = {
        "name": "status",
        "in": "query",
        "required": False,
        "description": "only withdrawals in this state",
        "schema": {"type": "string", "enum": WITHDRAWAL_STATES},
    }
    limit: dict[str, Any] = {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": "withdrawals in the page",
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_WITHDRAWALS_PAGE,
            "default": DEFAULT_WITHDRAWALS_PAGE,
        },
    }
    cursor = {
        "name": "cursor",
        "in": "query",
        "required": False,
        "description": "the `next_cursor` of the previous page",
        "schema": {"type": "string"},
    }
    listing = [user, behalf, state, limit, cursor]
    in_status = [
        {
            **state,
            "description": "the state of the withdrawals listed",
            "schema": {**state["schema"], "default": "requested"},
        },
        {
            "name": "older_than",
            "in": "query",
            "required": False,
            "description": "only those requested more than this many seconds ago",
            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OLDER_THAN},
        },
        {**limit, "schema": {**limit["schema"], "maximum": MAX_STATUS_PAGE}},
        cursor,
    ]
    note = {**body("OutcomeRequest"), "required": False}
    ops = {
        "/v1/wallets/{user_id}/withdrawals": {
            "post": operation(
                "requestWithdrawal",
                "Take money out of a wallet: debited at once, paid out by the host's payment "
                "system (the owner, a service for them, or an admin)",
                [user, key, behalf],
                body("WithdrawalRequest"),
                201,
                "WithdrawalOut",
                [400, 401, 403, 409, 413, 415, 422, 503],
            ),
            "get": operation(
                "listWithdrawals",
                "A wallet's withdrawals, newest first (the owner, a service for them, or an admin)",
                listing,
                None,
                200,
                "WithdrawalsOut",
                [401, 403, 422, 503],
            ),
        },
        "/v1/withdrawals": {
            "get": operation(
                "listWithdrawalsInStatus",
                "Every user's withdrawals in one state, oldest first; by default the "
                "requested ones, whose payout is not reported yet (admin only)",
                in_status,
                None,
                200,
                "WithdrawalsInStatusOut",
                [401, 403, 422, 503],
            )
        },
        "/v1/withdrawals/{withdrawal_id}": {
            "get": operation(
                "getWithdrawal",
                "A withdrawal and its state (its owner, a service, or an admin)",
                [withdrawal, behalf],
                None,
                200,
                "WithdrawalOut",
                [401, 403, 404, 503],
            )
        },
        "/v1/withdrawals/{withdrawal_id}/complete": {
            "post": operation(
                "completeWithdrawal",
                "The payout was made (a service or an admin); again: the same answer",
                [withdrawal],
                note,
                200,
                "WithdrawalOut",
                [400, 401, 403, 404, 409, 413, 415, 422, 503],
            )
        },
        "/v1/withdrawals/{withdrawal_id}/fail": {
            "post": operation(
                "failWithdrawal",
                "The payout failed: the money goes back to the wallet, once (a service or an "
                "admin); again: the same answer",
                [withdrawal],
                note,
                200,
                "WithdrawalOut",
                [400, 401, 403, 404, 409, 413, 415, 422, 503],
            )
        },
    }
    refusals = {
        "404": "no such withdrawal (`withdrawal_not_found`)",
        "409": (
            "`insufficient_balance`, `idempotency_conflict` (same key, other amount), or "
            "the other outcome was reported before (`withdrawal_already_completed`, "
            "`withdrawal_already_failed`)"
        ),
    }
    for methods in ops.values():
        for op in methods.values():
            for status, description in refusals.items():
                if status in op["responses"]:
                    op["responses"][status] = problem(description)
    return ops


def webhook_paths() -> dict[str, Any]:
    """Webhook endpoints, for admins (api/webhooks.py)."""
    webhook = path_param("webhook_id", {"type": "string", "maxLength": 32})
    deleted = {
        "operationId": "deleteWebhook",
        "summary": "Remove a webhook endpoint: nothing more is sent to it (admin only)",
        "parameters": [webhook],
        "responses": {"204": {"description": "removed"}, **problems([401, 403, 404, 503])},
    }
    return {
        "/v1/webhooks": {
            "post": operation(
                "createWebhook",
                "Register an endpoint for some event types; the answer has its signing "
                "secret (admin only)",
                [],
                body("WebhookRequest"),
                201,
                "WebhookOut",
                [400, 401, 403, 413, 415, 422, 503],
            ),
            "get": operation(
                "listWebhooks",
                "The webhook endpoints (admin only)",
                [],
                None,
                200,
                "WebhookListOut",
                [401, 403, 503],
            ),
        },
        "/v1/webhooks/{webhook_id}": {
            "get": operation(
                "getWebhook",
                "A webhook endpoint (admin only)",
                [webhook],
                None,
                200,
                "WebhookOut",
                [401, 403, 404, 503],
            ),
            "patch": operation(
                "updateWebhook",
                "Change an endpoint's URL, event types or batch size; its secret and its "
                "queued events stay (admin only)",
                [webhook],
                body("WebhookUpdate"),
                200,
                "WebhookOut",
                [400, 401, 403, 404, 413, 415, 422, 503],
            ),
            "delete": deleted,
        },
        "/v1/webhooks/{webhook_id}/rotate-secret": {
            "post": operation(
                "rotateWebhookSecret",
                "A new signing secret; the old one signs too for 24 hours (admin only)",
                [webhook],
                None,
                200,
                "WebhookOut",
                [401, 403, 404, 503],
            )
        },
        "/v1/webhooks/{webhook_id}/enable": {
            "post": operation(
                "enableWebhook",
                "Send events to a disabled endpoint again; its parked deliveries stay parked "
                "until an operator retries them (admin only)",
                [webhook],
                None,
                200,
                "WebhookOut",
                [401, 403, 404, 503],
            )
        },
    }
