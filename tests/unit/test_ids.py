"""Identifiers: require_user_id's quick check agrees with the documented pattern."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hongbao.domain.ids import USER_ID_PATTERN, require_user_id
from hongbao.errors import InvalidRequest

#: mostly allowed characters, with a few that are not (space, slash, newline, non-ASCII)
_TEXT = st.text(
    alphabet=st.sampled_from("aZ09_.:@-") | st.sampled_from(" /\n\t+é张\x00") | st.characters(),
    max_size=70,
)


@given(_TEXT)
def test_require_user_id_accepts_exactly_the_pattern(user_id: str) -> None:
    if re.fullmatch(USER_ID_PATTERN, user_id):
        assert require_user_id(user_id) == user_id
    else:
        with pytest.raises(InvalidRequest):
            require_user_id(user_id)


@pytest.mark.parametrize("user_id", ["x" * 64, "u_1.2:3@x-y", "A", "0"])
def test_require_user_id_accepts_edges(user_id: str) -> None:
    assert require_user_id(user_id) == user_id


@pytest.mark.parametrize("user_id", ["x" * 65, "", "a b", "alice\n", "\nalice", 7, None, b"ab"])
def test_require_user_id_refuses(user_id: object) -> None:
    with pytest.raises(InvalidRequest):
        require_user_id(user_id)
