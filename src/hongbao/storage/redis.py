"""Redis / Valkey store: the hot path. Every operation on a packet is one Lua script run
by SHA; the store is the only code that talks to Redis."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, ClassVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError, ResponseError

from hongbao.domain.models import GrabStatus
from hongbao.domain.rules import NO_RULES, PacketRules
from hongbao.errors import ConfigurationError, StorageError
from hongbao.keys import (
    PERSISTER_GROUP,
    REVOKED_KEY,
    REVOKED_VERSION_KEY,
    SETTLE_LAG_KEY,
    PacketKeys,
    bucket_of_key,
    dead_letter_key,
    events_key,
    resolved_key,
)
from hongbao.storage.codec import ClaimValue, grabber, pack_share, unpack_share
from hongbao.storage.connections import KeptConnections

RedisClient = aioredis.Redis | RedisCluster

log = logging.getLogger("hongbao.storage")

#: grab.lua's code for a grab of a packet whose keys it could not read
UNREADABLE = 5
#: grab.lua's code for a grab of a packet with rules whose rules keys the call did not
#: name (nothing of the packet changed: the grab is sent again with them)
NO_RULES_KEYS = 11
#: packets with rules a store remembers (beyond, it forgets the oldest: a packet it
#: forgot costs one more script call when grabbed next)
REMEMBERED_RULED = 65_536
#: GrabStatus by script return code, without an Enum call per grab (UNREADABLE and
#: NO_RULES_KEYS, which are no GrabStatus, hold places that are never read)
_STATUSES = tuple(
    GrabStatus(code) if code not in (UNREADABLE, NO_RULES_KEYS) else GrabStatus.UNKNOWN
    for code in range(max(*GrabStatus, NO_RULES_KEYS) + 1)
)

#: the oldest Redis the scripts run on (grab.lua pops with LPOP key count)
MIN_SERVER = (6, 2)
#: the one maxmemory-policy under which Redis never drops a key to free memory (a write
#: that would need more memory fails instead, and the grab answers 503)
NO_EVICTION = "noeviction"

#: entries read per XRANGE page when walking a stream
_PAGE = 1_000


def too_old(version: str) -> bool:
    """True for a Redis version before MIN_SERVER ("7.0.15", "6.0.9"; Valkey says 7.2.x)."""
    parts = version.split(".")[:2]
    try:
        return tuple(int(p) for p in parts) < MIN_SERVER
    except ValueError:
        return False  # a version we cannot read: let the scripts speak for themselves


def read_lua(name: str) -> str:
    return files("hongbao.storage").joinpath("lua", f"{name}.lua").read_text()


#: one grab's outcome, flat: its status, then the seq, amount and claimed_at_ms of the
#: user's claim, all three 0 when the user holds no share (seqs start at 1): one tuple a
#: grab, nothing to build or unpack on the hot path. For NOT_STARTED and
#: TOO_MANY_ATTEMPTS the last is the milliseconds to wait instead.
Answer = tuple[GrabStatus, int, int, int]


def claim_of(answer: Answer) -> ClaimValue | None:
    """The claim in a grab's answer, None when the user holds no share."""
    _, seq, amount, claimed_at_ms = answer
    return ClaimValue(seq, amount, claimed_at_ms) if seq else None


@dataclass(frozen=True, slots=True)
class LiveStatus:
    amount_left: int
    shares_left: int
    expires_at_ms: int
    closed_at_ms: int
    now_ms: int
    #: closed by a cancel (closed_at_ms is then when)
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class PacketSnapshot:
    """One packet in Redis, read atomically."""

    claims: dict[str, ClaimValue]
    #: unclaimed (index, amount) shares, in the order grabs take them
    shares: list[tuple[int, int]]
    left: int
    closed: bool

    @property
    def claimed_amount(self) -> int:
        return sum(c.amount for c in self.claims.values())


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a bucket's event stream."""

    stream: str
    id: str
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class Pending:
    id: str
    consumer: str
    idle_ms: int
    deliveries: int


class RedisStore:
    """Packets, claims and the bucket event streams on one Redis (or Sentinel primary)."""

    cluster: ClassVar[bool] = False

    def __init__(self, client: RedisClient, buckets: int, *, allow_eviction: bool = False) -> None:
        self.client = client
        self.buckets = buckets
        #: run on a server that may evict keys, with a warning (see `check_server`)
        self.allow_eviction = allow_eviction
        self._warned_eviction = False
        #: script calls skip redis-py's pool (see hongbao.storage.connections)
        self._kept = (
            KeptConnections(client.connection_pool) if isinstance(client, aioredis.Redis) else None
        )
        #: ids of the packets known to have rules, oldest first: grab.lua needs their
        #: audience and tries keys (see `grab_batch`)
        self._ruled: dict[str, None] = {}
        self.lua_load = self._script("load")
        self.lua_grab = self._script("grab")
        self.lua_close = self._script("close")
        self.lua_cancel = self._script("cancel")
        self.lua_status = self._script("status")
        self.lua_snapshot = self._script("snapshot")
        self.lua_restore_claims = self._script("restore_claims")
        self.lua_ack = self._script("ack")
        self.lua_dead_letter = self._script("dead_letter")
        self.lua_move_dead_letter = self._script("move_dead_letter")
        self.lua_rate_limit = self._script("rate_limit")
        self.lua_revoke = self._script("revoke")
        self.lua_revocations = self._script("revocations")
        self.lua_claims_lifetime = self._script("claims_lifetime")

    def _script(self, name: str) -> AsyncScript:
        return self.client.register_script(read_lua(name))

    def keys(self, packet_id: str) -> PacketKeys:
        return PacketKeys.of(packet_id, self.buckets)

    async def aclose(self) -> None:
        if self._kept is not None:
            await self._kept.aclose()
        await self.client.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except (RedisError, OSError):
            return False

    async def check_server(self) -> None:
        """At startup, refuse a server too old for the scripts (StorageError), and one
        whose maxmemory-policy may evict keys (ConfigurationError): an evicted packet
        loses its shares and claims. `allow_eviction` turns the refusal into a warning."""
        for node in await self._infos("server"):
            version = str(node.get("redis_version", ""))
            if too_old(version):
                raise StorageError(
                    f"redis {version} is too old: hongbao needs Redis >= "
                    f"{'.'.join(map(str, MIN_SERVER))} or Valkey (LPOP with a count)"
                )
        policy = await self.eviction_policy()
        if policy == NO_EVICTION:
            return
        message = (
            f"redis maxmemory-policy is {policy}: under memory pressure it may drop a "
            f"packet's keys; set maxmemory-policy {NO_EVICTION}"
        )
        if not self.allow_eviction:
            raise ConfigurationError(
                f"{message} (or accept the risk: --allow-eviction, HONGBAO_ALLOW_EVICTION=1)"
            )
        if not self._warned_eviction:
            log.warning("%s; running anyway (allow_eviction): money can be lost", message.upper())
            self._warned_eviction = True

    async def eviction_policy(self) -> str:
        """The server's maxmemory-policy; on a cluster the first node's that is not
        noeviction (``unknown`` when a server does not say)."""
        policies = [
            str(node.get("maxmemory_policy", "unknown")) for node in await self._infos("memory")
        ]
        return next((p for p in policies if p != NO_EVICTION), NO_EVICTION)

    async def _infos(self, section: str) -> list[dict[str, Any]]:
        """INFO `section` of the server (of every node of a cluster)."""
        info = await self._call(self.client.info(section))
        return [info]

    # -- packets -------------------------------------------------------------

    async def load_packet(
        self,
        keys: PacketKeys,
        *,
        expires_at_ms: int,
        keep_until_ms: int,
        shares: Sequence[tuple[int, int]],
        claims: Sequence[tuple[str, ClaimValue]] = (),
        rules: PacketRules = NO_RULES,
    ) -> bool:
        """Load unclaimed (index, amount) shares, earlier claims and the packet's rules
        (with its whole audience); False if already loaded."""
        amount_left = sum(amount for _, amount in shares)
        start = "" if rules.starts_at is None else int(rules.starts_at.timestamp() * 1000)
        args: list[Any] = [
            expires_at_ms,
            keep_until_ms,
            amount_left,
            len(shares),
            start,
            rules.passphrase_hash or "",
            len(rules.audience),
        ]
        args.extend(pack_share(index, amount) for index, amount in shares)
        args.extend(rules.audience)
        for user, claim in claims:
            args.extend((user, claim.encode()))
        loaded = await self._run(
            self.lua_load, [keys.meta, keys.shares, keys.claims, keys.audience], args
        )
        if rules.any:
            self._remember_ruled(keys.packet_id)
        return bool(loaded)

    def _remember_ruled(self, packet_id: str) -> None:
        ruled = self._ruled
        ruled[packet_id] = None
        if len(ruled) > REMEMBERED_RULED:
            del ruled[next(iter(ruled))]

    async def grab(
        self,
        keys: PacketKeys,
        user_id: str,
        actor: str | None = None,
        digests: str | None = None,
    ) -> Answer:
        """One grab, on its own script call (the service's grabs go through the coalescer);
        `actor` grabs for the user (recorded with the grant); `digests` are the
        passphrase's (`codec.grabber`)."""
        (answer,) = await self.grab_batch([(keys, [grabber(user_id, actor, digests)])])
        if isinstance(answer, StorageError):
            raise answer
        return answer

    async def grab_batch(
        self, groups: Sequence[tuple[PacketKeys, Sequence[str]]]
    ) -> list[Answer | StorageError]:
        """Grabs of (packet, grabbers in order) groups in one call of grab.lua; answers in
        the order of the groups and of the grabbers in each. A grabber is a user id, or
        `codec.grabber` of a user and the actor grabbing for them. On a cluster, one
        bucket only. A packet whose data Redis cannot read answers its own
        grabs with a StorageError.

        A packet's audience and tries keys are named only for the packets this store knows
        to have rules (it loaded them, or grab.lua said so before): grab.lua answers a
        packet with rules whose keys are missing with NO_RULES_KEYS and leaves it as it
        was, and its grabs are sent again in a call that names them."""
        bucket = groups[0][0].bucket
        keys: list[str] = []
        args: list[str] = [""]
        ruled = self._ruled
        named: list[int] = []
        for j, (packet, users) in enumerate(groups):
            if self.cluster and packet.bucket != bucket:
                raise ValueError("a grab batch must stay inside one bucket on a cluster")
            keys += (packet.events, packet.meta, packet.shares, packet.claims)
            args += (packet.packet_id, " ".join(users))
            if packet.packet_id in ruled:
                named.append(j)
        if named:
            args[0] = " ".join(map(str, named))
            for j in named:
                keys += (groups[j][0].audience, groups[j][0].tries)
        flat = await self._run(self.lua_grab, keys, args)
        resend = flat.pop()
        statuses = _STATUSES
        fours = iter(flat)
        answers: list[Answer | StorageError] = [
            (statuses[status], seq, amount, at)
            if status != UNREADABLE
            else StorageError("redis: the packet's data there is unreadable")
            for status, seq, amount, at in zip(fours, fours, fours, fours, strict=True)
        ]
        if resend:
            await self._grab_again_with_rules(groups, flat, answers)
        return answers

    async def _grab_again_with_rules(
        self,
        groups: Sequence[tuple[PacketKeys, Sequence[str]]],
        flat: list[int],
        answers: list[Answer | StorageError],
    ) -> None:
        """Send again the grabs of the packets grab.lua answered NO_RULES_KEYS (`flat` is
        its reply), now with their rules keys, and put their answers in `answers`."""
        again: list[tuple[int, int]] = []  # (group, its first answer's place)
        at = 0
        for g, (packet, users) in enumerate(groups):
            if NO_RULES_KEYS in flat[4 * at : 4 * (at + len(users)) : 4]:
                again.append((g, at))
                self._remember_ruled(packet.packet_id)
            at += len(users)
        if not again:  # every answer stands as it is
            return
        try:
            redone = iter(await self.grab_batch([groups[g] for g, _ in again]))
        except StorageError as exc:  # only the grabs sent again fail: the others were answered
            for g, start in again:
                answers[start : start + len(groups[g][1])] = [exc] * len(groups[g][1])
            return
        for g, start in again:
            for i in range(len(groups[g][1])):
                answers[start + i] = next(redone)

    async def close_packet(
        self, keys: PacketKeys, sender_id: str, retention_ms: int
    ) -> tuple[int, int, int]:
        """Run close.lua: (status, amount_left, shares_left)."""
        status, left, n = await self._run(
            self.lua_close,
            [keys.meta, keys.shares, keys.claims, keys.events],
            [keys.packet_id, sender_id, retention_ms],
        )
        return int(status), int(left), int(n)

    async def cancel_packet(
        self, keys: PacketKeys, sender_id: str, retention_ms: int
    ) -> tuple[int, int, int]:
        """Run cancel.lua: (status, amount_left, shares_left); see its header."""
        status, left, n = await self._run(
            self.lua_cancel,
            [keys.meta, keys.shares, keys.claims, keys.events],
            [keys.packet_id, sender_id, retention_ms],
        )
        return int(status), int(left), int(n)

    async def status(self, keys: PacketKeys) -> LiveStatus | None:
        exists, left, n, exp, closed, now, cancelled = await self._run(
            self.lua_status, [keys.meta, keys.shares], []
        )
        if not exists:
            return None
        return LiveStatus(int(left), int(n), int(exp), int(closed), int(now), bool(cancelled))

    async def claims(self, keys: PacketKeys) -> dict[str, ClaimValue]:
        raw = await self._call(self.client.hgetall(keys.claims))
        return {user: ClaimValue.parse(value) for user, value in raw.items()}

    async def snapshot(self, keys: PacketKeys) -> PacketSnapshot | None:
        """The packet's claims, unclaimed shares and meta, read atomically (None if absent)."""
        exists, left, closed, shares, claims = await self._run(
            self.lua_snapshot, [keys.meta, keys.shares, keys.claims], []
        )
        if not exists:
            return None
        pairs = iter(claims)
        return PacketSnapshot(
            {user: ClaimValue.parse(value) for user, value in zip(pairs, pairs, strict=True)},
            [unpack_share(packed) for packed in shares],
            int(left),
            bool(closed),
        )

    async def restore_claims(
        self, keys: PacketKeys, sender_id: str, claims: Sequence[tuple[str, ClaimValue]]
    ) -> tuple[int, list[str]]:
        """Put back the (user, claim) pairs the ledger holds and Redis forgot, atomically
        (see restore_claims.lua); (claims restored, one line per claim that cannot be)."""
        args: list[Any] = [keys.packet_id, sender_id]
        for user, claim in claims:
            args.extend((user, claim.share_index, claim.amount, claim.claimed_at_ms))
        restored, *conflicts = await self._run(
            self.lua_restore_claims, [keys.meta, keys.shares, keys.claims, keys.events], args
        )
        return int(restored), [str(line) for line in conflicts]

    async def keep_spent_claims(self, keys: PacketKeys, end_of_life_ms: int) -> bool:
        """Give the claims hash of a packet whose shares all went a lifetime when it has
        none (see claims_lifetime.lua); True when it had none."""
        return bool(
            await self._run(self.lua_claims_lifetime, [keys.meta, keys.claims], [end_of_life_ms])
        )

    async def forget_packet(self, keys: PacketKeys) -> None:
        """Delete a packet's keys (tests and recovery drills)."""
        await self._call(
            self.client.delete(keys.meta, keys.shares, keys.claims, keys.audience, keys.tries)
        )

    # -- token revocations ---------------------------------------------------------

    async def revoke_tokens(self, user_id: str, issued_until: int) -> int:
        """Revoke `user_id`'s tokens issued at or before `issued_until` (unix seconds);
        the new version of the revocations."""
        return int(
            await self._run(
                self.lua_revoke, [REVOKED_KEY, REVOKED_VERSION_KEY], [user_id, issued_until]
            )
        )

    async def revocations_version(self) -> int | None:
        """The revocations' version: changes on every revocation; None when Redis holds none."""
        version = await self._call(self.client.get(REVOKED_VERSION_KEY))
        return None if version is None else int(version)

    async def revocations(self) -> tuple[int | None, dict[str, int]]:
        """(version, user id -> unix seconds), read atomically."""
        version, *flat = await self._run(
            self.lua_revocations, [REVOKED_KEY, REVOKED_VERSION_KEY], []
        )
        pairs = iter(flat)
        table = {str(user): int(at) for user, at in zip(pairs, pairs, strict=True)}
        return (None if version is None else int(version)), table

    # -- settlement lag ------------------------------------------------------------

    async def report_settle_lag(self, lag_ms: int, ttl_ms: int) -> None:
        """Record how far behind the grabs the ledger is, for `ttl_ms`."""
        await self._call(self.client.set(SETTLE_LAG_KEY, lag_ms, px=ttl_ms))

    async def settle_lag_ms(self) -> int | None:
        """The last settlement lag a persister reported, ms; None once it expired."""
        raw = await self._call(self.client.get(SETTLE_LAG_KEY))
        return None if raw is None else int(raw)

    # -- rate limits -------------------------------------------------------------

    async def take_tokens(self, key: str, rate: float, burst: int, cost: int) -> tuple[bool, int]:
        """Take `cost` tokens from the token bucket at `key` (rate_limit.lua):
        (taken, milliseconds until there would be enough when not taken)."""
        allowed, wait_ms = await self._run(self.lua_rate_limit, [key], [repr(rate), burst, cost])
        return bool(int(allowed)), int(wait_ms)

    # -- durability ---------------------------------------------------------------

    async def replication(self) -> tuple[str, int]:
        """This server's replication role ("master", "slave") and connected replicas."""
        info = await self._call(self.client.info("replication"))
        return str(info.get("role", "")), int(info.get("connected_slaves", 0))

    async def write_then_wait(self, probe_key: str, *wait: Any) -> Any:
        """INCR `probe_key`, then `wait` (e.g. WAIT 1 1000) on the same connection.

        WAIT and WAITAOF count from the calling connection's last write; the probe
        makes that offset cover every write the server made before it."""
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(probe_key)
        pipe.execute_command(*wait)
        reply: list[Any] = await self._call(pipe.execute())
        return reply[1]

    # -- event streams -----------------------------------------------------------

    def streams(self) -> list[str]:
        return [events_key(b) for b in range(self.buckets)]

    async def ensure_groups(self) -> None:
        """Create the persister group on every bucket stream (idempotent)."""
        await self.check_server()
        for stream in self.streams():
            try:
                await self.client.xgroup_create(stream, PERSISTER_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise StorageError(f"cannot create consumer group on {stream}: {exc}") from exc

    async def read_events(self, consumer: str, count: int, block_ms: int | None) -> list[Event]:
        """New entries for this consumer from every bucket stream; waits up to `block_ms`
        for one when there is none (None: answers at once)."""
        streams: dict[Any, Any] = {s: ">" for s in self.streams()}
        reply = await self._call(
            self.client.xreadgroup(PERSISTER_GROUP, consumer, streams, count=count, block=block_ms)
        )
        return events_of_reply(reply)

    async def stream_entries(self) -> AsyncIterator[Event]:
        """Every entry now in the bucket streams (applied or not yet), stream by stream."""
        for stream in self.streams():
            last = "-"
            while True:
                rows = await self._call(self.client.xrange(stream, min=last, count=_PAGE))
                for entry_id, fields in rows:
                    yield Event(stream, str(entry_id), dict(fields))
                    last = "(" + str(entry_id)
                if len(rows) < _PAGE:
                    break

    async def pending(
        self, bucket: int, idle_ms: int, count: int, consumer: str | None = None
    ) -> list[Pending]:
        """Entries delivered at least `idle_ms` ago and not acknowledged (to `consumer`
        only, when given)."""
        rows = await self._call(
            self.client.xpending_range(
                events_key(bucket),
                PERSISTER_GROUP,
                "-",
                "+",
                count,
                consumername=consumer,
                idle=idle_ms,
            )
        )
        return [
            Pending(
                str(r["message_id"]),
                str(r["consumer"]),
                int(r["time_since_delivered"]),
                int(r["times_delivered"]),
            )
            for r in rows
        ]

    async def pending_consumers(self, bucket: int) -> dict[str, int]:
        """The consumers holding unacknowledged entries of a bucket stream, with how many."""
        summary = await self._call(self.client.xpending(events_key(bucket), PERSISTER_GROUP))
        return {str(c["name"]): int(c["pending"]) for c in summary.get("consumers") or []}

    async def claim_entries(
        self, bucket: int, consumer: str, idle_ms: int, ids: Sequence[str]
    ) -> list[Event]:
        """Take over pending entries of another (dead) consumer."""
        stream = events_key(bucket)
        rows = await self._call(
            self.client.xclaim(stream, PERSISTER_GROUP, consumer, idle_ms, list(ids))
        )
        return [Event(stream, str(i), dict(f)) for i, f in rows if f is not None]

    async def ack(self, stream: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        return int(await self._run(self.lua_ack, [stream], [PERSISTER_GROUP, *ids]))

    async def dead_letter(self, event: Event, reason: str) -> str:
        bucket = bucket_of_key(event.stream)
        flat = [x for pair in event.fields.items() for x in pair]
        return str(
            await self._run(
                self.lua_dead_letter,
                [event.stream, dead_letter_key(bucket)],
                [PERSISTER_GROUP, event.id, reason, *flat],
            )
        )

    async def retry_dead_letter(self, bucket: int, entry_id: str) -> str | None:
        """Move a parked entry back onto its bucket's event stream, for the persister to
        apply again; the new entry's id, or None when the bucket holds no such entry."""
        return await self._move_dead_letter(bucket, entry_id, events_key(bucket), "retry")

    async def resolve_dead_letter(self, bucket: int, entry_id: str, note: str) -> str | None:
        """Move a parked entry to its bucket's resolved stream, with `note`, never to be
        applied; the new entry's id, or None when the bucket holds no such entry."""
        return await self._move_dead_letter(bucket, entry_id, resolved_key(bucket), "resolve", note)

    async def _move_dead_letter(
        self, bucket: int, entry_id: str, to: str, how: str, note: str = ""
    ) -> str | None:
        new_id = await self._run(
            self.lua_move_dead_letter, [dead_letter_key(bucket), to], [entry_id, how, note]
        )
        return None if new_id is None else str(new_id)

    async def dead_letters(self, limit: int = 100) -> list[Event]:
        out: list[Event] = []
        for bucket in range(self.buckets):
            key = dead_letter_key(bucket)
            rows = await self._call(self.client.xrange(key, count=limit))
            out.extend(Event(key, str(i), dict(f)) for i, f in rows)
        return out[:limit]

    async def has_dead_letter(self, bucket: int, entry_id: str) -> bool:
        """Whether `entry_id` is on `bucket`'s dead-letter stream."""
        key = dead_letter_key(bucket)
        return bool(await self._call(self.client.xrange(key, min=entry_id, max=entry_id)))

    async def backlog(self) -> int:
        """Entries in the event streams not yet applied (persister lag)."""
        backlog, _ = await self.stream_lengths()
        return backlog

    async def stream_lengths(self) -> tuple[int, int]:
        """(entries in the event streams, entries in the dead-letter streams), in one
        round trip."""
        pipe = self.client.pipeline(transaction=False)
        for bucket in range(self.buckets):
            pipe.xlen(events_key(bucket))
            pipe.xlen(dead_letter_key(bucket))
        lengths: list[int] = await self._call(pipe.execute())
        return sum(lengths[0::2]), sum(lengths[1::2])

    # -- plumbing ------------------------------------------------------------------

    async def _run(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        return await self._call(self._evalsha(script, keys, args))

    async def _evalsha(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA on one of the store's kept connections."""
        kept = self._kept
        assert kept is not None  # a cluster store runs its scripts its own way
        try:
            return await kept.call("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:  # the server restarted or was flushed: load the script again
            script.sha = await kept.call("SCRIPT", "LOAD", script.script)
            return await kept.call("EVALSHA", script.sha, len(keys), *keys, *args)

    @staticmethod
    async def _call(awaitable: Any) -> Any:
        try:
            return await awaitable
        except (TimeoutError, RedisError, OSError) as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # redis-py may turn a cancelled blocking read into a connection error;
                # the caller is being cancelled, so let it end rather than retry
                raise asyncio.CancelledError from exc
            raise StorageError(f"redis: {brief(exc)}") from exc


def brief(exc: BaseException, most: int = 200) -> str:
    """The first line of an error's text, cut short: redis-py's may carry a whole
    connection pool's repr (a Sentinel that names no primary)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= most else text[:most] + "…"


def events_of_reply(reply: Any) -> list[Event]:
    """Flatten an XREADGROUP reply: [[stream, [[id, {field: value}], ...]], ...]."""
    return [
        Event(str(stream), str(entry_id), dict(fields or {}))
        for stream, entries in (reply or [])
        for entry_id, fields in entries
    ]
