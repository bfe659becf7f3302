"""Tests for hongbao.domain.money: exact yuan <-> fen conversions and amount checks."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hongbao.domain.money import FEN_PER_YUAN, fen_to_yuan, require_amount, yuan_to_fen
from hongbao.errors import InvalidRequest

#: the largest amount yuan_to_fen accepts: 13 digits of yuan and 99 fen
MAX_FEN = 10**13 * FEN_PER_YUAN - 1


@pytest.mark.parametrize(
    ("text", "fen"),
    [
        ("12.34", 1234),
        ("0.01", 1),
        ("12.3", 1230),
        ("12", 1200),
        ("0", 0),
        ("0.0", 0),
        ("0.00", 0),
        ("0.1", 10),
        ("0.10", 10),
        ("0.99", 99),
        ("1.05", 105),
        ("200", 20_000),
        ("199.99", 19_999),
        ("9999999999999.99", MAX_FEN),
    ],
)
def test_yuan_to_fen_is_exact(text: str, fen: int) -> None:
    result = yuan_to_fen(text)
    assert result == fen
    assert type(result) is int


@pytest.mark.parametrize(
    "text",
    [
        "1.234",  # three decimals
        "0.001",
        "-1",
        "-0.01",
        "+1",
        "abc",
        "1e3",
        "1E3",
        "",
        " ",
        " 1.2.3",
        "1.2.3",
        "01.00",  # leading zero
        "00",
        "007",
        "1.",
        ".5",
        "1,00",
        "1 000",
        "1_000",
        "0x10",
        "nan",
        "inf",
        "１２",  # full-width digits
        "١٢",  # Arabic-Indic digits
        "12 .3",
        "12\n3",
        "¥12",
        "10000000000000",  # 14 digits of yuan is more than the ledger should see
    ],
)
def test_yuan_to_fen_refuses(text: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        yuan_to_fen(text)
    assert isinstance(raised.value, ValueError)
    assert raised.value.code == "invalid_request"


@pytest.mark.parametrize(
    ("fen", "text"),
    [
        (0, "0.00"),
        (1, "0.01"),
        (10, "0.10"),
        (99, "0.99"),
        (100, "1.00"),
        (1234, "12.34"),
        (20_000, "200.00"),
        (-1, "-0.01"),
        (-1234, "-12.34"),
        (MAX_FEN, "9999999999999.99"),
    ],
)
def test_fen_to_yuan(fen: int, text: str) -> None:
    assert fen_to_yuan(fen) == text


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=MAX_FEN))
def test_fen_to_yuan_round_trip(fen: int) -> None:
    text = fen_to_yuan(fen)
    assert yuan_to_fen(text) == fen
    assert Decimal(text) * FEN_PER_YUAN == fen  # the text means what it says


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-MAX_FEN, max_value=MAX_FEN))
def test_fen_to_yuan_has_two_decimals_and_a_sign(fen: int) -> None:
    text = fen_to_yuan(fen)
    assert text.startswith("-") == (fen < 0)
    whole, _, frac = text.lstrip("-").partition(".")
    assert len(frac) == 2
    assert whole == str(abs(fen) // FEN_PER_YUAN)
    assert Fraction(text) == Fraction(fen, FEN_PER_YUAN)


@settings(max_examples=200, deadline=None)
@given(
    whole=st.integers(min_value=0, max_value=10**13 - 1),
    frac=st.one_of(st.just(""), st.from_regex(r"\A[0-9]{1,2}\Z")),
)
def test_yuan_to_fen_agrees_with_decimal(whole: int, frac: str) -> None:
    text = f"{whole}.{frac}" if frac else str(whole)
    fen = yuan_to_fen(text)
    assert fen == Decimal(text) * FEN_PER_YUAN
    assert yuan_to_fen(fen_to_yuan(fen)) == fen


@pytest.mark.parametrize("value", [1, 2, 100, 20_000, 10**15])
def test_require_amount_accepts_positive_ints(value: int) -> None:
    result = require_amount(value)
    assert result == value
    assert type(result) is int


@pytest.mark.parametrize(
    "value",
    [True, False, 1.0, 0.5, 12.34, float("nan"), 0, -1, -100, "1", "12.34", None, Decimal(1)],
)
def test_require_amount_refuses(value: object) -> None:
    with pytest.raises(InvalidRequest) as raised:
        require_amount(value, "total_amount")
    assert raised.value.field == "total_amount"


def test_require_amount_default_field() -> None:
    with pytest.raises(InvalidRequest) as raised:
        require_amount(0)
    assert raised.value.field == "amount"
