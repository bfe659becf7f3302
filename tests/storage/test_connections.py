"""The store's kept connections: reused while sound, replaced when stale, dropped mid-call."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ResponseError

from hongbao.storage import RedisStore
from hongbao.storage.connections import KeptConnections

pytestmark = pytest.mark.redis


def kept(store: RedisStore) -> KeptConnections:
    assert store._kept is not None
    return store._kept


async def test_calls_reuse_one_connection(store: RedisStore) -> None:
    conns = kept(store)
    ids = {await conns.call("CLIENT", "ID") for _ in range(20)}
    assert len(ids) == 1


async def test_concurrent_calls_keep_at_most_keep_idle(store: RedisStore) -> None:
    conns = kept(store)
    replies = await asyncio.gather(*(conns.call("PING") for _ in range(3 * conns.keep)))
    assert all(reply is True or reply == "PONG" for reply in replies)
    assert len(conns._idle) == conns.keep


async def test_a_connection_the_server_closed_is_replaced(store: RedisStore) -> None:
    conns = kept(store)
    first = await conns.call("CLIENT", "ID")
    await store.client.client_kill_filter(_id=first)
    await asyncio.sleep(0.05)
    second = await conns.call("CLIENT", "ID")  # no error: the stale one was noticed
    assert second != first


async def test_an_error_reply_keeps_the_connection(store: RedisStore) -> None:
    conns = kept(store)
    first = await conns.call("CLIENT", "ID")
    with pytest.raises(ResponseError):
        await conns.call("NO-SUCH-COMMAND")
    assert await conns.call("CLIENT", "ID") == first


async def test_a_call_cut_short_drops_its_connection(store: RedisStore) -> None:
    conns = kept(store)
    first = await conns.call("CLIENT", "ID")
    conns._timeout = 0.05
    with pytest.raises(TimeoutError):
        await conns.call("BLPOP", "hongbao-test:empty", 1)  # no reply within the timeout
    after = await conns.call("CLIENT", "ID")  # on a kept one, this would read BLPOP's nil
    assert isinstance(after, int) and after != first


async def test_scripts_come_back_after_a_script_flush(store: RedisStore) -> None:
    await store.client.script_flush()
    status = await store.status(store.keys("0" * 26))
    assert status is None  # status.lua ran: it was loaded again on NOSCRIPT
