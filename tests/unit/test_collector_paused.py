"""`collector_paused`: the cyclic collector is off inside, nested or not, and back on
after the last one; one switched off by someone else stays off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from hongbao.persister import collector_paused


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_off_inside_and_on_after_the_last_nested_pause() -> None:
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_on_again_when_the_batch_fails() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the batch failed")
    assert gc.isenabled()


def test_a_collector_someone_else_switched_off_stays_off() -> None:
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
