"""The store's kept connections: reused while sound, replaced when stale, dropped mid-call."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import ResponseError

from hongbao.storage import RedisStore
from hongbao.storage.connections import KeptConnections, pack_command

pytestmark = pytest.mark.redis


def kept(store: RedisStore) -> KeptConnections:
    assert store._kept is not None
    return store._kept


# what the store sends: a one-word command name, then text and integer arguments
_NAMES = st.text(st.characters(categories=["Lu", "Ll", "Nd"]), min_size=1, max_size=12)
_ARGS = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=["Cs"]), max_size=40),
        st.text(st.characters(max_codepoint=127), max_size=40),
        st.integers(min_value=-(2**70), max_value=2**70),
    ),
    max_size=60,
)


@given(_NAMES, _ARGS)
def test_pack_command_sends_what_redis_py_sends(name: str, args: list[str | int]) -> None:
    assert pack_command(name, *args) == b"".join(Connection().pack_command(name, *args))


@pytest.mark.parametrize("odd", [b"raw", 1.5, True, None, memoryview(b"m")])
def test_pack_command_leaves_other_types_to_redis_py(odd: object) -> None:
    assert pack_command("SET", "k", odd) is None


def test_pack_command_leaves_a_command_name_of_two_words_to_redis_py() -> None:
    assert pack_command("SCRIPT LOAD", "return 1") is None
    assert pack_command() is None


async def test_text_of_any_script_round_trips(store: RedisStore) -> None:
    args = ["h\u00e9llo", "\u7ea2\u5305", "", "a b", "x" * 10_000, 12, -7]
    reply = await kept(store).call("EVAL", "return ARGV", 0, *args)
    assert reply == [str(a) for a in args]


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
