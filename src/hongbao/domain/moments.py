"""Moments as Redis keeps them (unix milliseconds) and as Python does (aware UTC)."""

from __future__ import annotations

from datetime import UTC, datetime


def ms(moment: datetime) -> int:
    """Unix milliseconds of an aware datetime."""
    return int(moment.timestamp() * 1000)


def from_ms(value: int) -> datetime:
    """The aware UTC datetime of unix milliseconds."""
    return datetime.fromtimestamp(value / 1000, UTC)
