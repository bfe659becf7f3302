"""A few Redis connections kept out of redis-py's pool for the store's script calls.

Script calls are hongbao's hot path: a coalesced grab call carries dozens of grabs, and
an HTTP worker makes thousands of calls a second. Through `Redis.execute_command`, a call
pays the pool's checkout and release (a lock, a health check, observability hooks) and a
task per send for the socket timeout, more client CPU than the command itself (figures:
docs/performance.md). So the store keeps up to `keep` idle connections of its own. Like
the pool, it checks a connection for a stale socket (unread data, or the server gone)
before reusing it; one asyncio timeout bounds a whole call. A connection whose call did
not end with a complete reply is disconnected, never reused.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError, ResponseError


def pack_command(*args: object) -> bytes | None:
    """The RESP bytes of a command of str and int arguments, as redis-py sends them;
    None when another type is among them, or the command name has a space (redis-py
    sends "SCRIPT LOAD" as two words): redis-py's own packing takes those.

    A grab call over 8 packets has ~50 arguments, and redis-py's `Connection.pack_command`
    grows its byte string by one join per argument; here the whole command is one str,
    encoded once.
    """
    if not args or type(args[0]) is not str or " " in args[0]:
        return None
    texts: list[str] = []
    for arg in args:
        if type(arg) is str:
            texts.append(arg)
        elif type(arg) is int:  # not bool, which redis-py refuses
            texts.append(str(arg))
        else:
            return None
    packed = f"*{len(texts)}\r\n" + "".join([f"${len(t)}\r\n{t}\r\n" for t in texts])
    if packed.isascii():  # one byte a character: len() counted the bytes
        return packed.encode("ascii")
    parts = [t.encode() for t in texts]
    return f"*{len(parts)}\r\n".encode() + b"".join([b"$%d\r\n%s\r\n" % (len(p), p) for p in parts])


class KeptConnections:
    def __init__(self, pool: ConnectionPool, keep: int = 8) -> None:
        self.pool = pool
        self.keep = keep
        self._idle: list[AbstractConnection] = []
        #: the pool's socket timeout, applied per call instead of per socket operation
        self._timeout: float | None = pool.connection_kwargs.get("socket_timeout")

    async def call(self, *command: Any) -> Any:
        """Send one command and read its reply (an error reply raises its ResponseError)."""
        conn = await self._take()
        try:
            async with asyncio.timeout(self._timeout):
                packed = pack_command(*command)
                await conn.send_packed_command(
                    conn.pack_command(*command) if packed is None else packed, check_health=False
                )
                reply = await conn.read_response()
        except ResponseError:
            await self._put_back(conn)  # the whole error reply was read: still in step
            raise
        except BaseException:
            await self._drop(conn)  # a reply may still be on its way: never reuse it
            raise
        await self._put_back(conn)
        return reply

    async def aclose(self) -> None:
        """Hand the idle connections back to the pool, disconnected."""
        while self._idle:
            await self._drop(self._idle.pop())

    async def _take(self) -> AbstractConnection:
        while self._idle:
            conn = self._idle.pop()
            try:
                if conn.is_connected and not await conn.can_read():
                    return conn
            except (ConnectionError, OSError):
                pass
            await self._drop(conn)
        conn = await self.pool.get_connection()  # type: ignore[no-untyped-call]
        conn.socket_timeout = None  # else each send runs in a task of its own (wait_for)
        return conn  # type: ignore[no-any-return]

    async def _put_back(self, conn: AbstractConnection) -> None:
        if len(self._idle) < self.keep:
            self._idle.append(conn)
        else:
            conn.socket_timeout = self._timeout
            await self.pool.release(conn)

    async def _drop(self, conn: AbstractConnection) -> None:
        conn.socket_timeout = self._timeout
        await conn.disconnect(nowait=True)
        await self.pool.release(conn)
