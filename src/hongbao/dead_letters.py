"""`hongbao dead-letters`: the events the persister parked, retried or set aside.

The persister parks an entry it cannot apply (malformed, refused by the ledger, or
delivered too many times, e.g. while the database was down and persisters kept
crashing) on its bucket's dead-letter stream, with the reason. Once the cause is fixed,
`--retry` moves entries back onto their event stream: the persister applies them like
any other, and the ledger applies each claim and refund once, so an entry that was
partly applied before does no harm. An entry that still cannot be applied is parked
again, with its new reason.

An entry that must never be applied (garbage, or a refund the ledger rightly refused)
is resolved instead: `--resolve` moves it, with the operator's note, to the bucket's
resolved stream, where it stays for the record and out of audit's list.

Entries are named ``b<bucket>/<entry id>``, as the listing prints them. A listing shows
the first `LIMIT` entries and counts them all; ``--retry-all`` moves them all, a page at
a time; a name given to ``--retry`` or ``--resolve`` must be parked, listed or not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hongbao.errors import InvalidRequest
from hongbao.keys import bucket_of_key
from hongbao.storage import RedisStore

#: most entries listed, or moved by one page of ``--retry-all``
LIMIT = 10_000

_REF = re.compile(r"b(\d+)/(\d+-\d+)")


@dataclass(frozen=True, slots=True)
class Parked:
    """One entry of a dead-letter stream."""

    bucket: int
    entry_id: str
    reason: str
    #: the id the event had on its event stream
    event_id: str
    #: the event's own fields
    fields: dict[str, str]

    @property
    def ref(self) -> str:
        return entry_name(self.bucket, self.entry_id)


def entry_name(bucket: int, entry_id: str) -> str:
    """How the listing names an entry, and `parse_ref` reads it back."""
    return f"b{bucket}/{entry_id}"


def parse_ref(text: str, buckets: int) -> tuple[int, str]:
    """(bucket, entry id) of a ``b<bucket>/<entry id>`` name; InvalidRequest if malformed."""
    match = _REF.fullmatch(text.strip())
    if match is None:
        raise InvalidRequest(f"{text!r} is not a dead-letter entry: expected b<bucket>/<id>")
    bucket = int(match[1])
    if bucket >= buckets:
        raise InvalidRequest(f"{text!r}: there are only buckets 0-{buckets - 1}")
    return bucket, match[2]


async def parked(store: RedisStore, limit: int | None = None) -> list[Parked]:
    """The first `limit` (default `LIMIT`) parked entries, bucket by bucket, oldest first
    within a bucket."""
    out: list[Parked] = []
    for event in await store.dead_letters(limit=LIMIT if limit is None else limit):
        fields = dict(event.fields)
        reason, event_id = fields.pop("reason", ""), fields.pop("id", "")
        out.append(Parked(bucket_of_key(event.stream), event.id, reason, event_id, fields))
    return out


async def count(store: RedisStore) -> int:
    """How many entries are parked in all, listed or not."""
    _, parked_entries = await store.stream_lengths()
    return parked_entries


async def retry(store: RedisStore, refs: Sequence[str] | None) -> list[tuple[str, str | None]]:
    """Move the named entries (all when `refs` is None) back onto their event streams.

    Every name is checked before any entry moves: InvalidRequest names those that are
    malformed or not parked. Returns (name, new event id) per entry, the id None when
    the entry left its dead-letter stream meanwhile (another operator's move)."""
    if refs is None:
        return await _retry_all(store)
    return [
        (entry_name(bucket, entry_id), await store.retry_dead_letter(bucket, entry_id))
        for bucket, entry_id in await _targets(store, refs)
    ]


async def _retry_all(store: RedisStore) -> list[tuple[str, str | None]]:
    """Every parked entry back onto its event stream, `LIMIT` at a time: the moved ones
    leave the front of their streams, so each page read from the front is the next one.
    An entry a persister parks again meanwhile names as its event one of the ids this run
    gave (it failed once more): it stays parked, for the listing."""
    moved: list[tuple[str, str | None]] = []
    ours: set[str] = set()  # the event ids this run put on the event streams
    while True:
        page = [p for p in await parked(store) if p.event_id not in ours]
        if not page:
            return moved
        for entry in page:
            new_id = await store.retry_dead_letter(entry.bucket, entry.entry_id)
            moved.append((entry.ref, new_id))
            if new_id is not None:
                ours.add(new_id)


async def resolve(
    store: RedisStore, refs: Sequence[str], note: str
) -> list[tuple[str, str | None]]:
    """Move the named entries to their bucket's resolved stream with `note` (why they
    must never be applied), where they stay for the record; checked and answered like
    `retry`."""
    if not note.strip():
        raise InvalidRequest("say why in a note: resolved entries are never applied")
    return [
        (entry_name(bucket, entry_id), await store.resolve_dead_letter(bucket, entry_id, note))
        for bucket, entry_id in await _targets(store, refs)
    ]


async def _targets(store: RedisStore, refs: Sequence[str]) -> list[tuple[int, str]]:
    """(bucket, entry id) of each name, all parked."""
    targets = [parse_ref(ref, store.buckets) for ref in refs]
    unknown = [entry_name(b, i) for b, i in targets if not await store.has_dead_letter(b, i)]
    if unknown:
        raise InvalidRequest(f"no dead-letter entry {', '.join(unknown)}; nothing moved")
    return targets
