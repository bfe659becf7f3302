"""Every Redis key hongbao uses, in one place.

All keys of one packet, and the event stream of the packet's bucket, carry the
same hash tag ``{b<bucket>}``. A script touching them is therefore valid on Redis
Cluster (one slot), and the buckets spread the streams over the cluster's primaries.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

PREFIX = "hb"
#: consumer group every persister joins on every bucket stream
PERSISTER_GROUP = "persister"


def bucket_of(packet_id: str, buckets: int) -> int:
    """The bucket a packet lives in; stable for a given number of buckets."""
    return zlib.crc32(packet_id.encode()) % buckets


def bucket_tag(bucket: int) -> str:
    return f"{{b{bucket}}}"


def events_key(bucket: int) -> str:
    """Stream of grab / refund events of one bucket, read by the persister."""
    return f"{PREFIX}:{bucket_tag(bucket)}:ev"


def dead_letter_key(bucket: int) -> str:
    """Stream where entries the persister cannot apply are parked, with the reason."""
    return f"{PREFIX}:{bucket_tag(bucket)}:dlq"


def resolved_key(bucket: int) -> str:
    """Stream of dead letters an operator resolved without applying them, with the note."""
    return f"{PREFIX}:{bucket_tag(bucket)}:dlq:resolved"


def bucket_of_key(key: str) -> int:
    """The bucket in a key's hash tag (``hb:{b3}:ev`` -> 3); ValueError if it has none."""
    start = key.find("{b")
    end = key.find("}", start)
    if start < 0 or end < 0 or not key[start + 2 : end].isdigit():
        raise ValueError(f"{key!r} names no bucket")
    return int(key[start + 2 : end])


@dataclass(frozen=True, slots=True)
class PacketKeys:
    """The keys of one packet. ``meta`` is a hash, ``shares`` a list, ``claims`` a hash;
    a packet with rules also has ``audience`` (a set of user ids) and ``tries`` (a hash:
    user -> wrong passphrases, see grab.lua)."""

    packet_id: str
    bucket: int
    meta: str
    shares: str
    claims: str
    events: str
    audience: str
    tries: str

    @classmethod
    def of(cls, packet_id: str, buckets: int) -> PacketKeys:
        bucket = bucket_of(packet_id, buckets)
        base = f"{PREFIX}:{bucket_tag(bucket)}:p:{packet_id}"
        return cls(
            packet_id=packet_id,
            bucket=bucket,
            meta=f"{base}:m",
            shares=f"{base}:s",
            claims=f"{base}:c",
            events=events_key(bucket),
            audience=f"{base}:a",
            tries=f"{base}:w",
        )


def rate_limit_key(scope: str, subject: str) -> str:
    return f"{PREFIX}:rl:{scope}:{subject}"


#: user id -> unix second: the user's tokens issued then or before are revoked (one slot)
REVOKED_KEY = f"{PREFIX}:{{auth}}:revoked"
#: bumped on every revocation, so that API processes poll one small value
REVOKED_VERSION_KEY = f"{PREFIX}:{{auth}}:revoked:v"
#: how far behind the grabs the ledger is, ms: the persisters report it, API workers read
#: it to pace grabs (hongbao.pace); it expires when no persister reports
SETTLE_LAG_KEY = f"{PREFIX}:settle:lag"
