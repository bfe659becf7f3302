"""Settlement backpressure (hongbao.pace) against a real Redis and ledger: the persister
reports how far behind the grabs it is, and grabs pause while that is over the target."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from hongbao.cli.serve import SERVE_SETTLE_LAG_TARGET, default_settle_lag_target
from hongbao.pace import MAX_PAUSE, PAUSE_PER_LAG_SECOND, SettlementPace, grab_pause
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage import RedisStore

pytestmark = [pytest.mark.redis, pytest.mark.integration]


def test_the_pause_grows_with_the_lag_beyond_half_the_target() -> None:
    assert grab_pause(None, 1.0) == 0.0  # no persister reports
    assert grab_pause(30.0, 0.0) == 0.0  # pacing off
    assert grab_pause(0.5, 1.0) == 0.0
    assert grab_pause(1.5, 1.0) == pytest.approx(PAUSE_PER_LAG_SECOND)
    assert grab_pause(3.0, 1.0) == pytest.approx(2.5 * PAUSE_PER_LAG_SECOND)
    assert grab_pause(3_600.0, 1.0) == MAX_PAUSE


async def test_the_persister_reports_the_age_of_what_it_applied(
    service: Hongbao, persister: Persister
) -> None:
    await service.store.report_settle_lag(0, 1)  # nothing reported
    await asyncio.sleep(0.01)
    assert await service.store.settle_lag_ms() is None
    await service.deposit("s", 1_000)
    packet = await service.send("s", 1_000, 10)
    for n in range(10):
        await service.grab(packet.id, f"u{n}")
    await asyncio.sleep(0.3)  # the grabs wait 300 ms before the persister runs
    await persister.drain()
    lag = await service.store.settle_lag_ms()
    assert lag is not None and 300 <= lag < 5_000, lag


async def test_grabs_pause_while_the_reported_lag_is_over_the_target(
    service: Hongbao, store: RedisStore
) -> None:
    paced = Hongbao(store, service.ledger, replace(service.settings, settle_lag_target=1.0))
    await service.deposit("s", 1_000)
    packet = await paced.send("s", 1_000, 10)
    await store.report_settle_lag(60_000, 5_000)  # a minute behind: the longest pause
    started = time.monotonic()
    granted = await paced.grab(packet.id, "a")
    assert granted.first and time.monotonic() - started >= MAX_PAUSE
    assert paced.pace.pause == MAX_PAUSE

    await store.report_settle_lag(100, 5_000)  # caught up
    pace = SettlementPace(store, 1.0)
    await pace.wait()
    assert pace.pause == 0.0
    # with no target (the default off `serve`), a grab never reads the lag
    unpaced = Hongbao(store, service.ledger, service.settings)
    await store.report_settle_lag(60_000, 5_000)
    await unpaced.grab(packet.id, "b")
    assert (unpaced.pace.target, unpaced.pace.pause) == (0.0, 0.0)


def test_serve_paces_grabs_by_default_only_beside_its_own_persister() -> None:
    assert default_settle_lag_target(True, {}) == str(SERVE_SETTLE_LAG_TARGET)
    assert default_settle_lag_target(True, {"HONGBAO_SETTLE_LAG_TARGET": " "}) == "1.0"
    assert default_settle_lag_target(True, {"HONGBAO_SETTLE_LAG_TARGET": "0"}) is None
    assert default_settle_lag_target(False, {}) is None  # an API node
    pace = default_settle_lag_target(True, {})
    assert pace is not None
    settings = Settings.from_env({"HONGBAO_SETTLE_LAG_TARGET": pace})
    assert settings.settle_lag_target == SERVE_SETTLE_LAG_TARGET
