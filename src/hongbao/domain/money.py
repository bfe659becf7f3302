"""Money is an int number of fen (1 yuan = 100 fen). No floats, ever."""

from __future__ import annotations

import re

from hongbao.errors import InvalidRequest

FEN_PER_YUAN = 100
#: the most fen an amount or a balance may be: the ledger's BIGINT columns hold no more
MAX_FEN = 2**63 - 1
_YUAN = re.compile(r"^(0|[1-9][0-9]{0,12})(?:\.([0-9]{1,2}))?$")


def yuan_to_fen(text: str) -> int:
    """Parse "12", "12.3" or "12.34" yuan into fen exactly; anything else is an error."""
    match = _YUAN.match(text.strip())
    if not match:
        raise InvalidRequest(f"{text!r} is not an amount in yuan with at most two decimals")
    whole, frac = match.group(1), (match.group(2) or "").ljust(2, "0")
    return int(whole) * FEN_PER_YUAN + int(frac)


def fen_to_yuan(fen: int) -> str:
    """Format fen as yuan with two decimals: 1234 -> "12.34"."""
    sign = "-" if fen < 0 else ""
    whole, frac = divmod(abs(fen), FEN_PER_YUAN)
    return f"{sign}{whole}.{frac:02d}"


def require_amount(value: object, field: str = "amount") -> int:
    """An amount must be a positive int of at most MAX_FEN (bool and float are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{field} must be an integer number of fen", field)
    if value <= 0:
        raise InvalidRequest(f"{field} must be positive", field)
    if value > MAX_FEN:
        raise InvalidRequest(f"{field} must be at most {MAX_FEN} fen", field)
    return value
