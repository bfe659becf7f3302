"""The verified caller handed to the HTTP layer and, through it, to the service."""

from __future__ import annotations

from typing import NamedTuple

#: may deposit, read any wallet and the dashboard
ADMIN_ROLE = "hongbao:admin"
#: the host app's backend: acts for any user named in X-On-Behalf-Of
SERVICE_ROLE = "hongbao:service"
ON_BEHALF_HEADER = "X-On-Behalf-Of"
#: lifetime of the tokens hongbao mints unless told otherwise, seconds
DEFAULT_TTL = 86_400
#: an admin token lives at most this long (a leaked one is worth less), seconds
MAX_ADMIN_TTL = 86_400


class Principal(NamedTuple):
    """Who a request acts for (a tuple: built once per request, on the hot path).

    `user_id` is the user the request acts for: the token's ``sub``, or the user named in
    X-On-Behalf-Of by a service token. `actor` is then the service's ``sub`` (None when
    users act for themselves), which the ledger records. `issued_at` is the token's
    ``iat`` (None without one), `expires_at` its ``exp`` (unix seconds).
    """

    user_id: str
    admin: bool
    service: bool
    actor: str | None
    issued_at: int | None
    expires_at: int
