"""The service layer: send, grab, packet, claims, wallets, recovery.

Redis answers grabs; the SQL ledger holds the money. A packet is written to SQL
first (sender debited, shares stored), then loaded into Redis. Whenever Redis
does not know a packet that SQL says is open, it is rebuilt from the ledger, so
a crash between the two steps, or a Redis that lost its data, heals itself.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import json
import random
import secrets
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hongbao.coalescer import GrabCoalescer
from hongbao.domain.ids import new_packet_id, require_user_id, valid_packet_id
from hongbao.domain.models import (
    Claim,
    ClaimPosition,
    ClaimsList,
    GrabResult,
    GrabStatus,
    Packet,
    PacketStatus,
    SplitMode,
    Wallet,
    seq_of,
)
from hongbao.domain.moments import from_ms, ms
from hongbao.domain.money import require_amount
from hongbao.domain.rules import NO_RULES, PacketRules, SendLimits
from hongbao.domain.splitting import split
from hongbao.domain.text import require_greeting
from hongbao.durability import make_durability
from hongbao.errors import (
    Forbidden,
    HongbaoError,
    InvalidRequest,
    PacketCancelled,
    PacketExhausted,
    PacketExpired,
    PacketNotFound,
)
from hongbao.history import History
from hongbao.keys import PacketKeys
from hongbao.ledger import SqlLedger
from hongbao.ledger.sql import PacketRecord
from hongbao.pace import SettlementPace
from hongbao.ratelimit import RateLimiter
from hongbao.rules import (
    CANCELLED_BEFORE,
    CANCELLED_NOW,
    CLOSED_AT_EXPIRY,
    EXHAUSTED,
    NOT_IN_REDIS,
    grab_digests,
    rule_refusal,
    rule_request,
)
from hongbao.settings import Settings
from hongbao.storage import RedisStore, store_from_url
from hongbao.storage.codec import ClaimValue
from hongbao.storage.redis import LiveStatus
from hongbao.webhooks import AllowedHosts, WebhookEndpoints
from hongbao.withdrawals import Withdrawals

#: the grab path compares statuses with module constants: reading a member off an Enum
#: class goes through EnumType.__getattr__, as costly as the rest of the comparison
_UNKNOWN = GrabStatus.UNKNOWN
_GRANTED = GrabStatus.GRANTED

_RECORD_CACHE = 10_000
#: valid packet ids seen lately and their Redis keys (the cache is cleared when full)
_KEYS_CACHE = 16_384
#: a packet's keys live at least this long from their load, also when it is rebuilt after
#: its expiry plus retention: time for the sweeper to close it, and so refund its remainder
_MIN_KEY_LIFETIME_MS = 600_000


class Hongbao:
    """The red-packet service. Methods raise the typed errors of hongbao.errors."""

    def __init__(
        self,
        store: RedisStore,
        ledger: SqlLedger,
        settings: Settings,
        rng: random.Random | None = None,
        passphrase_keys: Sequence[bytes] = (),
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.settings = settings
        #: None: each send draws from a fresh generator seeded from os.urandom; tests
        #: pass a seeded Random to reproduce splits
        self.rng = rng
        #: keys of the passphrases' digests: the first makes them, any of them matches
        #: (the others are from before a rotation); see hongbao.domain.rules
        self.passphrase_keys = tuple(passphrase_keys)
        self._records: OrderedDict[str, PacketRecord] = OrderedDict()
        self._rules: OrderedDict[str, PacketRules] = OrderedDict()
        self._loading: dict[str, asyncio.Task[tuple[bool, PacketRecord | None]]] = {}
        self._keys: dict[str, PacketKeys] = {}
        #: every grab reaches Redis through the coalescer (one script call for many grabs)
        self.coalescer = GrabCoalescer(
            store, settings.coalesce_max_batch, settings.coalesce_max_in_flight
        )
        #: per-user and per-IP limits on grabs and sends, shared by every API process
        self.limiter = RateLimiter(store, settings)
        self.pace = SettlementPace(store, settings.settle_lag_target)
        #: when a grab is acknowledged (settings.ack_mode; see hongbao.durability)
        self.durability = make_durability(settings, store, ledger)
        #: money out of the wallets, paid by the host's payment system
        self.withdrawals = Withdrawals(ledger)
        #: the red-packet record and the daily statements, read from the ledger
        self.history = History(ledger)
        #: the webhook endpoints that receive the ledger's events
        self.webhooks = WebhookEndpoints(ledger, AllowedHosts.parse(settings.webhook_hosts))

    @classmethod
    async def connect(
        cls, settings: Settings, *, migrate: bool = False, passphrase_keys: Sequence[bytes] = ()
    ) -> Hongbao:
        store = store_from_url(
            settings.redis_url, settings.buckets, allow_eviction=settings.allow_eviction
        )
        ledger = SqlLedger.from_url(settings.database_url)
        try:
            if migrate:
                await ledger.migrate()
            await store.ensure_groups()
        except BaseException:
            await store.aclose()
            await ledger.aclose()
            raise
        service = cls(store, ledger, settings, passphrase_keys=passphrase_keys)
        try:
            await service.durability.check()
        except BaseException:
            await service.aclose()
            raise
        return service

    async def aclose(self) -> None:
        await self.durability.aclose()
        await self.store.aclose()
        await self.ledger.aclose()

    # -- wallets ------------------------------------------------------------------

    async def deposit(
        self,
        user_id: str,
        amount: int,
        reference: str | None = None,
        actor: str | None = None,
    ) -> Wallet:
        """Add money to a wallet; a repeated `reference` changes nothing the second time.
        `actor` (who deposits for the user, an admin) is recorded in the ledger."""
        require_user_id(user_id)
        require_amount(amount)
        if actor is not None:
            require_user_id(actor, "actor")
        balance = await self.ledger.deposit(
            user_id, amount, reference or uuid.uuid4().hex, actor=actor
        )
        return Wallet(user_id, balance)

    async def wallet(self, user_id: str) -> Wallet:
        require_user_id(user_id)
        return Wallet(user_id, await self.ledger.balance(user_id))

    # -- sending ------------------------------------------------------------------

    async def send(
        self,
        sender_id: str,
        total_amount: int,
        count: int,
        mode: SplitMode | str = SplitMode.LUCKY,
        greeting: str = "",
        expires_in: int | None = None,
        idempotency_key: str | None = None,
        actor: str | None = None,
        *,
        audience: Sequence[str] | None = None,
        passphrase: str | None = None,
        starts_at: datetime | None = None,
    ) -> Packet:
        """Debit the sender, split the money into shares and open the packet for grabs.
        `actor` (who sends for the sender, a service) is recorded in the ledger.

        Rules (hongbao.domain.rules): only the users of `audience` may grab; a grab must
        carry `passphrase`; grabs open at `starts_at` (the lifetime counts from it). The
        send counts against the sender's daily limits (SendLimitReached past one)."""
        require_user_id(sender_id, "sender_id")
        if actor is not None:
            require_user_id(actor, "actor")
        require_amount(total_amount, "total_amount")
        if isinstance(count, bool) or not isinstance(count, int):
            raise InvalidRequest("count must be an integer", "count")
        try:
            mode = SplitMode(mode)
        except ValueError:
            raise InvalidRequest("mode must be 'lucky' or 'equal'", "mode") from None
        require_greeting(greeting)
        lifetime = self.settings.default_expires_in if expires_in is None else expires_in
        if (
            isinstance(lifetime, bool)
            or not isinstance(lifetime, int)
            or not (1 <= lifetime <= self.settings.max_expires_in)
        ):
            raise InvalidRequest(
                f"expires_in must be 1 to {self.settings.max_expires_in} seconds", "expires_in"
            )
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= 128:
            raise InvalidRequest("Idempotency-Key must be 1 to 128 characters", "idempotency_key")
        now = datetime.now(UTC)
        asked = rule_request(count, now, self.passphrase_keys, audience, passphrase, starts_at)
        # SystemRandom costs a syscall per draw (seconds for a 10,000-share packet); a
        # Mersenne Twister seeded with 128 fresh random bits per packet is fast and
        # its amounts are only seen after they are taken, in a fixed order
        rng = self.rng or random.Random(secrets.randbits(128))
        amounts = split(mode, total_amount, count, rng, self.settings.split_limits)
        rule_part = asked.request_part(self.passphrase_keys)
        request = json.dumps([total_amount, count, mode.value, greeting, lifetime, *rule_part])
        packet_id = new_packet_id(ms(now))
        rules = asked.for_packet(packet_id, self.passphrase_keys)
        record = PacketRecord(
            id=packet_id,
            sender_id=sender_id,
            total_amount=total_amount,
            count=count,
            mode=mode.value,
            greeting=greeting,
            status=PacketStatus.ACTIVE.value,
            created_at=now,
            expires_at=(rules.starts_at or now) + timedelta(seconds=lifetime),
            request_hash=hashlib.sha256(request.encode()).hexdigest(),
        )
        limits = SendLimits(self.settings.max_sends_per_day, self.settings.max_sent_per_day)
        record, created = await self.ledger.create_packet(
            record, amounts, idempotency_key, actor=actor, rules=rules, limits=limits
        )
        if created:
            await self._load(record, list(enumerate(amounts)), [], rules)
        else:
            await self.ensure_loaded(record.id)
        return await self.packet(record.id)

    # -- grabbing -----------------------------------------------------------------

    async def grab(
        self,
        packet_id: str,
        user_id: str,
        actor: str | None = None,
        passphrase: str | None = None,
    ) -> GrabResult:
        """Take one share for this user; the same user again gets the same share back.
        `actor` (who grabs for the user, a service) travels with the grant to the ledger;
        `passphrase` is what the user typed for a packet that asks for one."""
        require_user_id(user_id)
        if actor is not None:
            require_user_id(actor, "actor")
        keys = self.keys_of(packet_id)
        digests = None
        if passphrase is not None:
            digests = grab_digests(self.passphrase_keys, packet_id, passphrase)
        if self.pace.target:
            await self.pace.wait()
        submit = self.coalescer.submit
        status, seq, amount, at = await submit(keys, user_id, actor, digests)
        if status is _UNKNOWN:  # Redis lacks the packet: load it, or ask SQL
            loaded, record = await self._loaded(packet_id)
            if loaded:
                status, seq, amount, at = await submit(keys, user_id, actor, digests)
            if status is _UNKNOWN:
                return await self._grab_from_ledger(record, packet_id, user_id)
        if not seq:  # the user holds no share (for some refusals `at` is the wait, ms)
            raise _refusal(packet_id, status, at)
        first = status is _GRANTED
        if self.durability.waits:
            claim = ClaimValue(seq, amount, at)
            await self.durability.confirm(keys, user_id, claim, actor if first else None)
        return GrabResult(packet_id, user_id, amount, seq, first, at)

    def keys_of(self, packet_id: str) -> PacketKeys:
        """The Redis keys of a well-formed packet id; PacketNotFound for any other text.

        Hot packets are grabbed thousands of times a second: their ids are checked and
        their key names built once, then found with one dict lookup."""
        keys = self._keys.get(packet_id) if isinstance(packet_id, str) else None
        if keys is None:
            if not valid_packet_id(packet_id):
                raise PacketNotFound(f"no packet {_shown(packet_id)}")
            if len(self._keys) >= _KEYS_CACHE:
                self._keys.clear()
            keys = self._keys[packet_id] = self.store.keys(packet_id)
        return keys

    async def _grab_from_ledger(
        self, record: PacketRecord | None, packet_id: str, user_id: str
    ) -> GrabResult:
        """A packet Redis no longer holds (closed long ago): answer from SQL's `record`."""
        if record is None:
            raise PacketNotFound(f"no packet {packet_id}")
        for row in await self.ledger.claims_of(packet_id):
            if row.user_id == user_id:
                return GrabResult(
                    packet_id, user_id, row.amount, seq_of(row.share_idx), False, ms(row.claimed_at)
                )
        if record.status == PacketStatus.CANCELLED:
            raise PacketCancelled(f"packet {packet_id} was cancelled")
        if record.claimed_count >= record.count:
            raise PacketExhausted(f"packet {packet_id} has no shares left")
        raise PacketExpired(f"packet {packet_id} has expired")

    # -- cancelling -----------------------------------------------------------------

    async def cancel(self, packet_id: str, by: str, *, admin: bool = False) -> Packet:
        """Close an open packet at once and refund what is left to its sender, through
        the refund event and the persister, as at expiry. Only its sender (`by`) or an
        admin may. Cancelling again answers the same packet; a packet that expired or
        ran out first cannot be cancelled (PacketExpired, PacketExhausted)."""
        record = await self._record(packet_id)
        if by != record.sender_id and not admin:
            raise Forbidden("only the packet's sender or an admin may cancel it")
        keys = self.keys_of(packet_id)
        retention_ms = self.settings.retention_seconds * 1000
        status, left, _ = await self.store.cancel_packet(keys, record.sender_id, retention_ms)
        if status == NOT_IN_REDIS and await self.ensure_loaded(packet_id):
            status, left, _ = await self.store.cancel_packet(keys, record.sender_id, retention_ms)
        if status == NOT_IN_REDIS:  # closed long ago: the ledger says how
            fresh = await self.ledger.get_packet(packet_id) or record
            if fresh.status == PacketStatus.CANCELLED:
                status = CANCELLED_BEFORE
            elif fresh.status == PacketStatus.EXHAUSTED:
                status = EXHAUSTED
        if status in (CANCELLED_NOW, CANCELLED_BEFORE):
            return await self.packet(packet_id)
        if status == EXHAUSTED or (status == CLOSED_AT_EXPIRY and left == 0):
            raise PacketExhausted(f"packet {packet_id} has no shares left to give back")
        raise PacketExpired(f"packet {packet_id} has expired")

    # -- reading ------------------------------------------------------------------

    async def live_status(self, packet_id: str) -> LiveStatus | None:
        """The packet's live state in Redis (None when Redis does not hold it)."""
        return await self.store.status(self.keys_of(packet_id))

    async def packet(self, packet_id: str) -> Packet:
        record = await self._record(packet_id)
        live = await self.live_status(packet_id)
        if live is None and await self.ensure_loaded(packet_id):
            live = await self.live_status(packet_id)
        rules = await self._rules_of(packet_id)
        if live is not None:
            status = _live_status(live)
            left_count, left_amount = live.shares_left, live.amount_left
            # closed in Redis: what was left is the refund, on its way or applied
            refunded = live.amount_left if live.closed_at_ms else 0
        else:
            fresh = await self.ledger.get_packet(packet_id) or record
            status = PacketStatus(fresh.status)
            left_count = fresh.count - fresh.claimed_count
            left_amount = fresh.total_amount - fresh.claimed_amount
            refunded = fresh.refunded_amount
        return Packet(
            id=record.id,
            sender_id=record.sender_id,
            total_amount=record.total_amount,
            count=record.count,
            mode=SplitMode(record.mode),
            greeting=record.greeting,
            status=status,
            remaining_count=left_count,
            remaining_amount=left_amount,
            created_at=record.created_at,
            expires_at=record.expires_at,
            refunded_amount=refunded,
            starts_at=rules.starts_at,
            audience_size=rules.audience_size,
            passphrase=rules.passphrase_hash is not None,
        )

    async def audience(self, packet_id: str) -> list[str]:
        """The users a packet is for, by id (empty: anyone may grab)."""
        await self._record(packet_id)
        return await self.ledger.audience_of(packet_id)

    async def in_audience(self, packet_id: str, user_id: str) -> bool:
        """Whether a packet's audience names the user (False for a packet without one)."""
        await self._record(packet_id)
        return await self.ledger.in_audience(packet_id, user_id)

    async def claims(
        self, packet_id: str, *, limit: int | None = None, after: ClaimPosition | None = None
    ) -> ClaimsList:
        """Who got what, in grab order, `limit` claims from after `after` (all by default);
        best luck once every share is taken, and the totals, of the whole packet."""
        record = await self._record(packet_id)
        keys = self.keys_of(packet_id)
        live = await self.store.status(keys)
        if live is not None:
            found = [
                Claim(user, c.amount, c.seq, from_ms(c.claimed_at_ms))
                for user, c in (await self.store.claims(keys)).items()
            ]
            exhausted = live.shares_left == 0 and live.amount_left == 0
        else:
            found = [
                Claim(r.user_id, r.amount, seq_of(r.share_idx), r.claimed_at)
                for r in await self.ledger.claims_of(packet_id)
            ]
            exhausted = len(found) == record.count
        found.sort(key=_grab_order)
        best = max(found, key=lambda c: c.amount, default=None) if exhausted else None
        start = 0 if after is None else bisect.bisect_right(found, after, key=_grab_order)
        end = len(found) if limit is None else start + limit
        page = found[start:end]
        return ClaimsList(
            packet_id,
            page,
            best.user_id if best else None,
            claimed_count=len(found),
            claimed_amount=sum(c.amount for c in found),
            next_after=_grab_order(page[-1]) if page and end < len(found) else None,
        )

    # -- Redis state from the ledger -------------------------------------------------

    async def ensure_loaded(self, packet_id: str) -> bool:
        """Load an open packet into Redis from the ledger if Redis lacks it.

        Only unclaimed shares are loaded, and earlier claims come along so their
        owners keep their answer. Returns True if the packet is in Redis now.
        Concurrent callers for one packet share one load: after a Redis loss a storm
        on a hot packet would otherwise read its shares from SQL once per grabber.
        """
        loaded, _ = await self._loaded(packet_id)
        return loaded

    async def _loaded(self, packet_id: str) -> tuple[bool, PacketRecord | None]:
        """`ensure_loaded`, and the ledger's record of the packet (None: no such packet).
        One ledger read of the packet, shared by concurrent callers."""
        loading = self._loading.get(packet_id)
        if loading is None:
            loading = asyncio.create_task(self._load_from_ledger(packet_id))
            self._loading[packet_id] = loading
            loading.add_done_callback(lambda _: self._loading.pop(packet_id, None))
        # shielded: a caller that gives up does not cancel the load for the others
        return await asyncio.shield(loading)

    async def _load_from_ledger(self, packet_id: str) -> tuple[bool, PacketRecord | None]:
        record = await self.ledger.get_packet(packet_id)
        if record is None or record.status != PacketStatus.ACTIVE or record.closed_at:
            return False, record
        claimed = await self.ledger.claims_of(packet_id)
        taken = {c.share_idx for c in claimed}
        unclaimed = [(i, a) for i, a in await self.ledger.shares_of(packet_id) if i not in taken]
        earlier = [
            (c.user_id, ClaimValue.of_share(c.share_idx, c.amount, ms(c.claimed_at)))
            for c in claimed
        ]
        await self._load(record, unclaimed, earlier, await self.ledger.packet_rules(packet_id))
        return True, record

    async def recover(self) -> int:
        """Rebuild every open packet missing from Redis; returns how many were rebuilt."""
        rebuilt, after = 0, ""
        while batch := await self.ledger.open_packets(after_id=after):
            for record in batch:
                if await self.live_status(record.id) is None:
                    rebuilt += await self.ensure_loaded(record.id)
            after = batch[-1].id
        return rebuilt

    async def _load(
        self,
        record: PacketRecord,
        shares: list[tuple[int, int]],
        claims: list[tuple[str, ClaimValue]],
        rules: PacketRules = NO_RULES,
    ) -> bool:
        retention = self.settings.retention_seconds * 1000
        keep_until = max(
            ms(record.expires_at) + retention,
            ms(datetime.now(UTC)) + max(retention, _MIN_KEY_LIFETIME_MS),
        )
        return await self.store.load_packet(
            self.keys_of(record.id),
            expires_at_ms=ms(record.expires_at),
            keep_until_ms=keep_until,
            shares=shares,
            claims=claims,
            rules=rules,
        )

    async def _record(self, packet_id: str) -> PacketRecord:
        """The immutable part of a packet (cached); PacketNotFound if there is none."""
        record = self._records.get(packet_id)
        if record is None:
            self.keys_of(packet_id)  # PacketNotFound unless the id is well-formed
            record = await self.ledger.get_packet(packet_id)
            if record is None:
                raise PacketNotFound(f"no packet {packet_id}")
            record = replace(record, request_hash=None)
            self._records[packet_id] = record
            if len(self._records) > _RECORD_CACHE:
                self._records.popitem(last=False)
        return record

    async def _rules_of(self, packet_id: str) -> PacketRules:
        """A packet's rules without its audience's users (cached, like `_record`)."""
        rules = self._rules.get(packet_id)
        if rules is None:
            rules = (await self.ledger.packet_rules(packet_id, audience=False)).summary()
            self._rules[packet_id] = rules
            if len(self._rules) > _RECORD_CACHE:
                self._rules.popitem(last=False)
        return rules


def _refusal(packet_id: str, status: GrabStatus, wait_ms: int) -> HongbaoError:
    """Why a grab that got no share was turned away (`wait_ms`: how long until it may
    succeed, for the refusals that end by themselves)."""
    by_rule = rule_refusal(packet_id, status, wait_ms)
    if by_rule is not None:
        return by_rule
    if status is GrabStatus.EXHAUSTED:
        return PacketExhausted(f"packet {packet_id} has no shares left")
    if status is GrabStatus.EXPIRED:
        return PacketExpired(f"packet {packet_id} has expired")
    return PacketNotFound(f"no packet {packet_id}")


def _shown(value: object) -> str:
    """A value from a request, quoted and cut short for a message."""
    text = value if isinstance(value, str) else repr(value)
    return repr(text if len(text) <= 40 else text[:40] + "…")


def _grab_order(claim: Claim) -> ClaimPosition:
    return ClaimPosition(ms(claim.claimed_at), claim.seq)


def _live_status(live: LiveStatus) -> PacketStatus:
    if live.cancelled:
        return PacketStatus.CANCELLED
    if live.shares_left == 0 and live.amount_left == 0:
        return PacketStatus.EXHAUSTED
    if live.closed_at_ms or live.now_ms >= live.expires_at_ms:
        return PacketStatus.EXPIRED
    return PacketStatus.ACTIVE
