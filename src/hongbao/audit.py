"""`hongbao audit` and `hongbao recover`: check every money invariant; rebuild Redis.

The audit is safe while the service runs. Per open packet it takes one atomic
snapshot of the packet in Redis (MULTI: claims, shares, meta), then reads the
event streams (claims not yet persisted), then the ledger's claims, so that

- every claim Redis holds is in the ledger or still pending in a stream
  (a claim acknowledged but neither persisted nor pending is a lost claim),
- every claim the ledger holds is in Redis (re-read, for grabs made meanwhile),
- no share is issued twice and no user holds two shares,
- claimed + still grabbable (or refunded) = total, in Redis,

plus the ledger's own invariants (`SqlLedger.audit`: counters match claims,
claimed + refunded = total for closed packets, no negative balance, each wallet =
the sum of its entries, wallets + money held in open packets = deposits).
Dead-letter entries are listed (they are not by themselves a violation: a claim
that was dead-lettered shows up as a Redis claim missing from the ledger).

`recover` rebuilds open packets Redis lost entirely (from the ledger: unclaimed
shares and the earlier claims) and repairs packets Redis lost part of (a claim
the ledger has but Redis forgot is put back and its share taken out of the
unclaimed list, under WATCH so a concurrent grab just makes it try again). A packet
Redis closed after forgetting claims refunded their money again, a refund the ledger
refuses; recover puts the claims back and emits the refund of what is really left.
It is idempotent and safe while the service runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import sqlalchemy as sa
from redis.exceptions import RedisError, WatchError
from sqlalchemy.exc import DBAPIError

from hongbao.domain.moments import ms
from hongbao.errors import ConfigurationError, HongbaoError, StorageError
from hongbao.keys import PacketKeys
from hongbao.ledger.schema import claims
from hongbao.ledger.sql import ClaimRow, PacketRecord
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage.redis import ClaimValue, Event, grants_in, pack_share

#: how long the audit waits for the persister to drain before comparing (informational)
SETTLE_SECONDS = 10.0


@dataclass
class PacketSnapshot:
    """One packet in Redis, read atomically."""

    claims: dict[str, ClaimValue]
    shares: list[tuple[int, int]]
    left: int
    closed: bool

    @property
    def claimed_amount(self) -> int:
        return sum(c.amount for c in self.claims.values())


@dataclass
class AuditReport:
    violations: list[str] = field(default_factory=list)
    backlog: int = 0
    dead_letters: list[Event] = field(default_factory=list)
    open_packets: int = 0
    missing_in_redis: int = 0
    pending_claims: int = 0

    @property
    def clean(self) -> bool:
        return not self.violations

    def lines(self) -> list[str]:
        out = [
            f"open packets checked: {self.open_packets}",
            f"stream backlog: {self.backlog} entries ({self.pending_claims} claims pending)",
            f"dead-letter entries: {len(self.dead_letters)}"
            + (" (`hongbao dead-letters` lists and retries them)" if self.dead_letters else ""),
        ]
        for event in self.dead_letters:
            fields = " ".join(f"{k}={v}" for k, v in event.fields.items())
            out.append(f"  dead letter {event.stream} {event.id}: {fields}")
        out.extend(f"VIOLATION {v}" for v in self.violations)
        out.append("audit: clean" if self.clean else f"audit: {len(self.violations)} violation(s)")
        return out


@dataclass
class RecoverReport:
    rebuilt: int = 0
    repaired_claims: int = 0
    conflicts: list[str] = field(default_factory=list)


# -- reading ------------------------------------------------------------------------------


async def snapshot(service: Hongbao, keys: PacketKeys) -> PacketSnapshot | None:
    """The packet's claims, unclaimed shares and meta in one MULTI (None if not in Redis)."""
    client: Any = service.store.client
    pipe = client.pipeline(transaction=not service.store.cluster)
    pipe.hgetall(keys.claims)
    pipe.lrange(keys.shares, 0, -1)
    pipe.hmget(keys.meta, "exp", "left", "closed")
    try:
        raw_claims, raw_shares, meta = await pipe.execute()
    except (TimeoutError, RedisError, OSError) as exc:
        raise StorageError(f"redis: {exc}") from exc
    if meta[0] is None:
        return None
    shares = []
    for packed in raw_shares:
        index, amount = divmod(int(packed), pack_share(1, 0))
        shares.append((index, amount))
    return PacketSnapshot(
        {u: ClaimValue.parse(v) for u, v in raw_claims.items()},
        shares,
        int(meta[1] or 0),
        meta[2] is not None,
    )


async def pending_claims(service: Hongbao) -> dict[tuple[str, str], ClaimValue]:
    """Claim events still in the bucket streams: (packet, user) -> claim."""
    found: dict[tuple[str, str], ClaimValue] = {}
    store = service.store
    for stream in store.streams():
        last = "-"
        while True:
            rows = await store._call(store.client.xrange(stream, min=last, count=1000))
            for entry_id, fields in rows:
                with contextlib.suppress(KeyError, ValueError):
                    for user, claim in grants_in(fields):
                        found[(fields["p"], user)] = claim
                last = "(" + str(entry_id)
            if len(rows) < 1000:
                break
    return found


async def open_packets(service: Hongbao) -> AsyncIterator[PacketRecord]:
    after = ""
    while batch := await service.ledger.open_packets(after_id=after):
        for record in batch:
            yield record
        after = batch[-1].id


# -- audit --------------------------------------------------------------------------------


async def audit(service: Hongbao, settle: float = SETTLE_SECONDS) -> AuditReport:
    """Every invariant; `settle` seconds are given to a running persister to drain first."""
    report = AuditReport()
    store = service.store
    deadline = asyncio.get_running_loop().time() + settle
    while True:  # polling another process's progress: no event to wait on
        backlog = await store.backlog()
        if not backlog or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(0.2)
    report.backlog = backlog
    report.violations.extend(await service.ledger.audit())
    report.violations.extend(await _ledger_duplicates(service))

    records = [r async for r in open_packets(service)]
    report.open_packets = len(records)
    snaps: dict[str, PacketSnapshot | None] = {}
    for record in records:
        snaps[record.id] = await snapshot(service, store.keys(record.id))
    pending = await pending_claims(service)
    report.pending_claims = len(pending)

    for record in records:
        snap = snaps[record.id]
        if snap is None:
            report.missing_in_redis += 1
            report.violations.append(
                f"packet {record.id}: open in the ledger but missing from Redis "
                "(run `hongbao recover`)"
            )
            continue
        report.violations.extend(
            await _compare(
                service, record, snap, await service.ledger.claims_of(record.id), pending
            )
        )
    report.dead_letters = await store.dead_letters(limit=1000)
    return report


async def _ledger_duplicates(service: Hongbao) -> list[str]:
    """Users with two claims, or shares claimed twice, in the ledger (the schema's unique
    constraints forbid both; checked anyway, since the audit trusts nothing)."""
    out: list[str] = []
    try:
        async with service.ledger.engine.connect() as conn:
            for column, what in ((claims.c.user_id, "user"), (claims.c.share_idx, "share")):
                rows = await conn.execute(
                    sa.select(claims.c.packet_id, column, sa.func.count())
                    .group_by(claims.c.packet_id, column)
                    .having(sa.func.count() > 1)
                )
                out.extend(f"packet {p}: {what} {v} claimed {n} times" for p, v, n in rows)
    except (DBAPIError, OSError) as exc:
        raise StorageError(f"database: {exc}") from exc
    return out


async def _compare(
    service: Hongbao,
    record: PacketRecord,
    snap: PacketSnapshot,
    ledger_claims: list[ClaimRow],
    pending: dict[tuple[str, str], ClaimValue],
) -> list[str]:
    pid = record.id
    out: list[str] = []
    # Redis on its own
    holders: dict[int, str] = {}
    for user, claim in snap.claims.items():
        if claim.seq in holders:
            out.append(
                f"packet {pid}: share {claim.seq - 1} issued twice ({holders[claim.seq]}, {user})"
            )
        holders[claim.seq] = user
    for index, _ in snap.shares:
        if index + 1 in holders:
            out.append(f"packet {pid}: share {index} is both claimed and still grabbable")
    if snap.claimed_amount + snap.left != record.total_amount:
        out.append(
            f"packet {pid}: Redis claimed {snap.claimed_amount} + left {snap.left} "
            f"!= total {record.total_amount}"
        )
    if not snap.closed:
        if sum(a for _, a in snap.shares) != snap.left:
            out.append(
                f"packet {pid}: Redis shares sum to {sum(a for _, a in snap.shares)}, "
                f"left says {snap.left}"
            )
        if len(snap.claims) + len(snap.shares) != record.count:
            out.append(
                f"packet {pid}: Redis has {len(snap.claims)} claims + {len(snap.shares)} shares "
                f"!= count {record.count}"
            )
    # Redis vs the ledger (+ claims pending in the streams)
    in_ledger = {c.user_id: c for c in ledger_claims}
    for user, claim in snap.claims.items():
        row = in_ledger.get(user)
        if row is not None:
            if (row.share_idx + 1, row.amount) != (claim.seq, claim.amount):
                out.append(
                    f"packet {pid}: {user} holds share {claim.seq - 1} ({claim.amount} fen) in "
                    f"Redis but share {row.share_idx} ({row.amount} fen) in the ledger"
                )
            continue
        queued = pending.get((pid, user))
        if queued is None or (queued.seq, queued.amount) != (claim.seq, claim.amount):
            out.append(
                f"packet {pid}: claim of {user} (share {claim.seq - 1}, {claim.amount} fen) "
                "is in Redis but neither in the ledger nor pending"
            )
    missing = [c for c in ledger_claims if c.user_id not in snap.claims]
    if missing:  # grabs made after the snapshot are in Redis by now
        fresh = await service.store.claims(service.store.keys(pid))
        for row in missing:
            found = fresh.get(row.user_id)
            if found is None:
                out.append(
                    f"packet {pid}: ledger claim of {row.user_id} (share {row.share_idx}) "
                    "is missing from Redis (run `hongbao recover`)"
                )
            elif (found.seq, found.amount) != (row.share_idx + 1, row.amount):
                out.append(
                    f"packet {pid}: {row.user_id} holds share {row.share_idx} in the ledger "
                    f"but share {found.seq - 1} in Redis"
                )
    return out


# -- recover ------------------------------------------------------------------------------


async def recover(service: Hongbao) -> RecoverReport:
    """Rebuild what Redis lost of the open packets, from the ledger. Idempotent."""
    report = RecoverReport()
    store = service.store
    await store.ensure_groups()  # a wiped Redis lost the streams' consumer group too
    async for record in open_packets(service):
        keys = store.keys(record.id)
        if await store.status(keys) is None:
            report.rebuilt += await service.ensure_loaded(record.id)
            continue
        if store.cluster:
            continue  # WATCH across a cluster pipeline is not supported: rebuild only
        await _repair(service, record, keys, await service.ledger.claims_of(record.id), report)
    return report


async def _repair(
    service: Hongbao,
    record: PacketRecord,
    keys: PacketKeys,
    ledger_claims: list[ClaimRow],
    report: RecoverReport,
) -> None:
    """Put claims the ledger has and Redis forgot back into Redis (under WATCH).

    A packet Redis closed after forgetting them emitted a refund that counts their money
    again; the ledger refuses it (claimed + refund > total, a dead letter). Its claims
    are put back all the same, and a refund of what is really left follows."""
    if not ledger_claims:
        return
    client: Any = service.store.client
    for _attempt in range(50):
        try:
            async with client.pipeline(transaction=True) as pipe:
                await pipe.watch(keys.meta, keys.shares, keys.claims)
                current = await pipe.hgetall(keys.claims)
                unclaimed = set(await pipe.lrange(keys.shares, 0, -1))
                closed, left, nleft = await pipe.hmget(keys.meta, "closed", "left", "nleft")
                ttl = int(await pipe.pttl(keys.meta))
                # a closed packet's unclaimed shares are gone: a forgotten share is one
                # that no claim in Redis holds
                held = (
                    {ClaimValue.parse(v).seq for v in current.values()}
                    if closed is not None
                    else set()
                )
                fixes: list[tuple[ClaimRow, str]] = []
                conflicts: list[str] = []
                for row in ledger_claims:
                    if row.user_id in current:
                        claim = ClaimValue.parse(current[row.user_id])
                        if claim.seq != row.share_idx + 1:
                            conflicts.append(
                                f"packet {keys.packet_id}: {row.user_id} holds share "
                                f"{row.share_idx} in the ledger, {claim.seq - 1} in Redis"
                            )
                        continue
                    packed = str(pack_share(row.share_idx, row.amount))
                    free = (
                        (packed in unclaimed) if closed is None else (row.share_idx + 1 not in held)
                    )
                    if free:
                        fixes.append((row, packed))
                    else:
                        conflicts.append(
                            f"packet {keys.packet_id}: share {row.share_idx} of {row.user_id} "
                            "was issued again by Redis after it lost data"
                        )
                pipe.multi()
                for row, packed in fixes:
                    value = ClaimValue(row.share_idx + 1, row.amount, ms(row.claimed_at))
                    pipe.hset(keys.claims, row.user_id, value.encode())
                    pipe.lrem(keys.shares, 1, packed)
                    pipe.hincrby(keys.meta, "left", -row.amount)
                if fixes and ttl > 0:
                    pipe.pexpire(keys.claims, ttl)
                if fixes and closed is not None:
                    refund = int(left) - sum(row.amount for row, _ in fixes)
                    shares_left = int(nleft) - len(fixes)
                    pipe.hset(keys.meta, "nleft", shares_left)
                    pipe.xadd(
                        keys.events,
                        {
                            "k": "r",
                            "p": keys.packet_id,
                            "s": record.sender_id,
                            "a": refund,
                            "n": shares_left,
                            "t": closed,
                        },
                    )
                await pipe.execute()
        except WatchError:
            continue
        except (TimeoutError, RedisError, OSError) as exc:
            raise StorageError(f"redis: {exc}") from exc
        report.repaired_claims += len(fixes)
        report.conflicts.extend(conflicts)
        return
    report.conflicts.append(f"packet {keys.packet_id}: too busy to repair; run recover again")


# -- the commands ---------------------------------------------------------------------------


def _settings(
    data_dir: Path, redis_url: str | None, database_url: str | None
) -> tuple[Settings, Any]:
    """Settings like `serve`; in embedded mode, the running server if there is one."""
    from hongbao.runtime import embedded_settings, ledger_url
    from hongbao.storage.embedded import EmbeddedServer, _info_pid, _read_int

    if redis_url:
        return Settings.from_env(
            redis_url=redis_url, database_url=database_url or ledger_url(data_dir)
        ), None
    data_dir = Path(data_dir).resolve()
    probe = EmbeddedServer(data_dir)
    port = _read_int(probe.port_file)
    if port is not None and _info_pid(port, probe.config_path) is not None:
        # `hongbao serve` is running on this data dir: use its server, do not start another
        return Settings.from_env(
            redis_url=f"redis://127.0.0.1:{port}/0",
            database_url=database_url or ledger_url(data_dir),
        ), None
    if not (data_dir / "redis").is_dir():
        raise ConfigurationError(f"{data_dir} holds no hongbao data (no redis/ folder)")
    return embedded_settings(data_dir, database_url=database_url)


async def _run(settings: Settings, do_recover: bool, settle: float, out: TextIO) -> int:
    service = await Hongbao.connect(settings, migrate=False)
    try:
        if do_recover:
            fixed = await recover(service)
            print(
                f"recover: rebuilt {fixed.rebuilt} packet(s), "
                f"restored {fixed.repaired_claims} claim(s)",
                file=out,
            )
            for line in fixed.conflicts:
                print(f"CONFLICT {line}", file=out)
        report = await audit(service, settle)
        for line in report.lines():
            print(line, file=out)
        return 0 if report.clean else 1
    finally:
        await service.aclose()


def main(
    data_dir: Path,
    redis_url: str | None,
    database_url: str | None,
    *,
    do_recover: bool,
    settle: float = SETTLE_SECONDS,
    out: TextIO = sys.stdout,
) -> int:
    """Body of `hongbao audit` / `hongbao recover`: 0 clean, 1 a violation (named on stdout)."""
    return run_offline(
        data_dir, redis_url, database_url, lambda settings: _run(settings, do_recover, settle, out)
    )


def run_offline(
    data_dir: Path,
    redis_url: str | None,
    database_url: str | None,
    body: Callable[[Settings], Coroutine[Any, Any, int]],
) -> int:
    """Run an operator command's `body` on the settings `serve` would use (in embedded
    mode, on serve's running server, or on one started just for it); its exit code."""
    settings, server = _settings(data_dir, redis_url, database_url)
    try:
        return asyncio.run(body(settings))
    except HongbaoError:
        raise
    except (RedisError, OSError) as exc:
        raise StorageError(str(exc)) from exc
    finally:
        if server is not None:
            server.stop()
