"""The pieces the OpenAPI document is built of: an operation, its parameters, its body,
and the problem+json answers it documents (used by openapi.py and openapi_paths.py)."""

from __future__ import annotations

from typing import Any

from hongbao.api.errors import PROBLEM_TYPE
from hongbao.api.routes import MAX_BODY

REF = "#/components/schemas/{model}"

ERRORS = {
    400: "the body is declared JSON but is not valid JSON (`malformed_json`)",
    401: "missing, malformed, forged, expired or revoked bearer token (`unauthorized`)",
    403: (
        "not allowed for this caller, or X-On-Behalf-Of without the service role "
        "(`forbidden`); a grab the packet's rules refuse: `not_in_audience`, "
        "`wrong_passphrase`"
    ),
    404: (
        "no such packet (`packet_not_found`), webhook endpoint (`webhook_not_found`) or "
        "route (`not_found`)"
    ),
    409: (
        "`insufficient_balance`, `idempotency_conflict` (same key, other body), or a grab "
        "before the packet's start (`not_started`; see Retry-After)"
    ),
    410: "`packet_exhausted`, `packet_expired` or `packet_cancelled`",
    413: f"body over {MAX_BODY} bytes (`payload_too_large`)",
    415: "body is not JSON (`unsupported_media_type`)",
    422: "a field is invalid (`invalid_request`; `field` names it)",
    429: (
        "too many grabs or sends from this user or address (`rate_limited`), too many "
        "wrong passphrases for this packet (`too_many_attempts`), or the sender's daily "
        "limit reached (`send_limit_reached`); see Retry-After"
    ),
    503: "Redis or the database is unreachable (`storage_unavailable`)",
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def path_param(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def body(model: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": ref(model)}}}


def problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {PROBLEM_TYPE: {"schema": ref("Problem")}}}


def problems(codes: list[int]) -> dict[str, Any]:
    """The documented problem+json answers for these statuses."""
    return {str(code): problem(ERRORS[code]) for code in codes}


def operation(
    operation_id: str,
    summary: str,
    parameters: list[dict[str, Any]],
    request_body: dict[str, Any] | None,
    status: int,
    model: str,
    errors: list[int],
) -> dict[str, Any]:
    responses: dict[str, Any] = {
        str(status): {"description": "OK", "content": {"application/json": {"schema": ref(model)}}}
    }
    responses.update(problems(errors))
    op: dict[str, Any] = {"operationId": operation_id, "summary": summary, "responses": responses}
    if parameters:
        op["parameters"] = parameters
    if request_body is not None:
        op["requestBody"] = request_body
    return op


def plain(operation_id: str, summary: str, responses: dict[int, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status, model in responses.items():
        media = PROBLEM_TYPE if model == "Problem" else "application/json"
        out[str(status)] = {
            "description": "OK" if status < 400 else "not ready",
            "content": {media: {"schema": ref(model)}},
        }
    return {"operationId": operation_id, "summary": summary, "security": [], "responses": out}
