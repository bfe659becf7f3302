"""Tables of the ledger (SQLAlchemy Core). Alembic's migrations create the same."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

metadata = sa.MetaData()

#: microsecond timestamps everywhere (MySQL's DATETIME defaults to whole seconds)
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: autoincrement ids: SQLite only autoincrements INTEGER PRIMARY KEY
RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
#: MySQL/MariaDB compare strings by their collation, case-insensitively by default, so
#: "ALICE" would find alice's wallet. Identifiers compare byte for byte everywhere:
#: SQLite (BINARY) does so by default.
BINARY_COLLATION = "utf8mb4_bin"
#: PostgreSQL's default collation compares equal only equal bytes, but orders through
#: strcoll, which costs every comparison in an index on an id; "C" is a memcmp, and the
#: order Python sorts ids in (revision 0011)
BYTE_ORDER_COLLATION = "C"


def identifier(length: int) -> sa.types.TypeEngine[str]:
    """A VARCHAR for user ids, packet ids, references and keys: exact comparison, in
    byte order."""
    return (
        sa.String(length)
        .with_variant(mysql.VARCHAR(length, collation=BINARY_COLLATION), "mysql", "mariadb")
        .with_variant(postgresql.VARCHAR(length, collation=BYTE_ORDER_COLLATION), "postgresql")
    )


IDEMPOTENCY_KEY_LENGTH = 128
UserId = identifier(64)
PacketId = identifier(32)
Reference = identifier(160)
IdempotencyKey = identifier(IDEMPOTENCY_KEY_LENGTH)

#: the kind of a claim's ledger entry
CLAIM_KIND = "claim"
#: a withdrawal debits the wallet when it is requested; a failed one is reversed (the
#: money goes back, once)
ENTRY_KINDS = ("deposit", "send", CLAIM_KIND, "refund", "withdrawal", "reversal")
STATUSES = ("active", "exhausted", "expired", "cancelled")
WITHDRAWAL_STATES = ("requested", "completed", "failed")
DELIVERY_STATES = ("pending", "delivered", "parked")
#: "evt_" and 26 characters (see hongbao.ledger.outbox.new_event_id)
EventId = identifier(32)
#: "wd_" / "we_" and their random part
WithdrawalId = identifier(32)
EndpointId = identifier(32)

wallets = sa.Table(
    "hb_wallets",
    metadata,
    sa.Column("user_id", UserId, primary_key=True),
    sa.Column("balance", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.CheckConstraint("balance >= 0", name="ck_wallet_balance_not_negative"),
)

entries = sa.Table(
    "hb_ledger_entries",
    metadata,
    sa.Column("id", RowId, primary_key=True, autoincrement=True),
    #: what this entry applies, e.g. "claim:<packet>:<index>"; unique, so nothing applies
    #: twice (a claim's entry by its claim's unique share, see uq_entry_reference)
    sa.Column("reference", Reference, nullable=False),
    sa.Column("user_id", UserId, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    #: signed: credits positive, debits negative
    sa.Column("amount", sa.BigInteger, nullable=False),
    sa.Column("packet_id", PacketId, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    #: a deposit's idempotency key, unique per user; NULL for other kinds
    sa.Column("deposit_key", IdempotencyKey, nullable=True),
    #: who acted for the user: an admin's deposit, a service's send or grab (the ``sub``
    #: of their token); NULL when users act for themselves
    sa.Column("actor", UserId, nullable=True),
    sa.CheckConstraint(
        "kind IN ('deposit', 'send', 'claim', 'refund', 'withdrawal', 'reversal')",
        name="ck_entry_kind",
    ),
    #: partial where the database has them: a claim's entry is written only with its
    #: claim, whose unique (packet, share) its reference names (revision 0012)
    sa.Index(
        "uq_entry_reference",
        "reference",
        unique=True,
        postgresql_where=sa.text(f"kind <> '{CLAIM_KIND}'"),
        sqlite_where=sa.text(f"kind <> '{CLAIM_KIND}'"),
    ),
    #: partial where the database has them: the entries of other kinds add nothing to it
    sa.Index(
        "uq_entry_deposit_key",
        "user_id",
        "deposit_key",
        unique=True,
        postgresql_where=sa.text("deposit_key IS NOT NULL"),
        sqlite_where=sa.text("deposit_key IS NOT NULL"),
    ),
    #: a wallet's entries newest first, and (covering) the sum of those after one
    sa.Index("ix_entries_user_id", "user_id", "id", "amount"),
    sa.Index("ix_entries_created", "created_at"),
)

packets = sa.Table(
    "hb_packets",
    metadata,
    sa.Column("id", PacketId, primary_key=True),
    sa.Column("sender_id", UserId, nullable=False),
    sa.Column("total_amount", sa.BigInteger, nullable=False),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("mode", sa.String(16), nullable=False),
    sa.Column("greeting", sa.String(200), nullable=False, server_default=""),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("expires_at", Timestamp, nullable=False),
    sa.Column("claimed_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("claimed_amount", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("refunded_amount", sa.BigInteger, nullable=False, server_default="0"),
    #: set once the remainder was refunded (or found to be zero) after expiry
    sa.Column("closed_at", Timestamp, nullable=True),
    sa.Column("idempotency_key", IdempotencyKey, nullable=True),
    sa.Column("request_hash", sa.String(64), nullable=True),
    sa.CheckConstraint("total_amount > 0", name="ck_packet_total_positive"),
    sa.CheckConstraint("count > 0", name="ck_packet_count_positive"),
    sa.CheckConstraint(
        "claimed_amount + refunded_amount <= total_amount", name="ck_packet_conserved"
    ),
    sa.CheckConstraint("claimed_count <= count", name="ck_packet_claims_le_count"),
    sa.CheckConstraint(
        "status IN ('active', 'exhausted', 'expired', 'cancelled')", name="ck_packet_status"
    ),
    sa.UniqueConstraint("sender_id", "idempotency_key", name="uq_packet_idempotency"),
    sa.Index("ix_packets_status_expires", "status", "expires_at"),
    #: the packets a user sent, newest first, and (covering) a year's totals
    sa.Index(
        "ix_packets_sender_time", "sender_id", "created_at", "id", "total_amount", "refunded_amount"
    ),
    #: the oldest open packet; finished packets by age (see hb_best_luck)
    sa.Index("ix_packets_status_created", "status", "created_at"),
)

shares = sa.Table(
    "hb_shares",
    metadata,
    sa.Column("packet_id", PacketId, sa.ForeignKey("hb_packets.id"), primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("amount", sa.BigInteger, nullable=False),
    sa.CheckConstraint("amount > 0", name="ck_share_amount_positive"),
)

claims = sa.Table(
    "hb_claims",
    metadata,
    sa.Column("id", RowId, primary_key=True, autoincrement=True),
    sa.Column("packet_id", PacketId, nullable=False),
    sa.Column("share_idx", sa.Integer, nullable=False),
    sa.Column("user_id", UserId, nullable=False),
    sa.Column("amount", sa.BigInteger, nullable=False),
    sa.Column("claimed_at", Timestamp, nullable=False),
    # no foreign key to the share: the persister looks each share up under its packet's
    # lock before the claim is written, and `hongbao audit` checks every claim against
    # its share (revision 0010: PostgreSQL's check was a trigger per row)
    sa.UniqueConstraint("packet_id", "user_id", name="uq_claim_packet_user"),
    sa.UniqueConstraint("packet_id", "share_idx", name="uq_claim_packet_share"),
    #: the packets a user grabbed, newest first, and (covering) a year's count and sum
    sa.Index("ix_claims_user_time", "user_id", "claimed_at", "id", "amount"),
    #: the largest claims of a packet first: is this claim its best luck?
    sa.Index("ix_claims_packet_amount", "packet_id", "amount"),
)

#: who got the best luck of each finished packet: derived from hb_packets and hb_claims
#: (`hongbao.ledger.history.index_best_luck`), so that a year's best-luck count is one
#: index range. A finished packet's claims never change, so neither does its row.
best_luck = sa.Table(
    "hb_best_luck",
    metadata,
    sa.Column("packet_id", PacketId, sa.ForeignKey("hb_packets.id"), primary_key=True),
    #: the largest claim's user and time (ties: the earliest grab); NULL when the packet
    #: has no best luck (equal shares, or not one claim)
    sa.Column("user_id", UserId, nullable=True),
    sa.Column("claimed_at", Timestamp, nullable=True),
    sa.Index("ix_best_luck_user_time", "user_id", "claimed_at"),
)

#: named moments of derived tables; "best_luck": every finished packet created before it
#: has its hb_best_luck row
history_marks = sa.Table(
    "hb_history_marks",
    metadata,
    sa.Column("name", sa.String(32), primary_key=True),
    sa.Column("at", Timestamp, nullable=False),
)

#: a packet's rules, for the packets that have any (see hongbao.domain.rules)
packet_rules = sa.Table(
    "hb_packet_rules",
    metadata,
    sa.Column("packet_id", PacketId, sa.ForeignKey("hb_packets.id"), primary_key=True),
    #: grabs open then (the packet's expires_at counts from it); NULL: at once
    sa.Column("starts_at", Timestamp, nullable=True),
    #: HMAC-SHA256 (hex) of the packet id and the passphrase; never the passphrase itself
    sa.Column("passphrase_hash", sa.String(64), nullable=True),
    #: users in hb_packet_audience for the packet; 0: anyone may grab
    sa.Column("audience_size", sa.Integer, nullable=False, server_default="0"),
)

#: the users a packet with an audience is for
packet_audience = sa.Table(
    "hb_packet_audience",
    metadata,
    sa.Column("packet_id", PacketId, sa.ForeignKey("hb_packets.id"), primary_key=True),
    sa.Column("user_id", UserId, primary_key=True),
)

#: what each sender sent on a UTC day, for the sender limits
sender_days = sa.Table(
    "hb_sender_days",
    metadata,
    sa.Column("sender_id", UserId, primary_key=True),
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("sends", sa.Integer, nullable=False),
    sa.Column("amount", sa.BigInteger, nullable=False),
)

#: money leaving a wallet: debited when requested (entry "withdrawal:<id>"), paid out by
#: the host's payment system, which reports it completed or failed; a failed one is
#: reversed (entry "reversal:<id>")
withdrawals = sa.Table(
    "hb_withdrawals",
    metadata,
    sa.Column("id", WithdrawalId, primary_key=True),
    sa.Column("user_id", UserId, nullable=False),
    sa.Column("amount", sa.BigInteger, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    #: the request's Idempotency-Key, unique per user
    sa.Column("idempotency_key", IdempotencyKey, nullable=False),
    #: who asked for the user (a service or an admin); NULL when the user did
    sa.Column("actor", UserId, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    #: the payment system's reference on completion, or why it failed
    sa.Column("outcome_note", sa.String(200), nullable=True),
    sa.CheckConstraint("amount > 0", name="ck_withdrawal_amount_positive"),
    sa.CheckConstraint(
        "status IN ('requested', 'completed', 'failed')", name="ck_withdrawal_status"
    ),
    sa.UniqueConstraint("user_id", "idempotency_key", name="uq_withdrawal_idempotency"),
    #: the withdrawals of a status oldest first (those in flight for an operator), the
    #: audit's sum per status
    sa.Index("ix_withdrawals_status_time", "status", "created_at", "id"),
    #: a user's newest first
    sa.Index("ix_withdrawals_user_time", "user_id", "created_at"),
)

#: the transactional outbox: each event is written in the transaction of the ledger
#: change it reports, and only when some webhook endpoint subscribes to its type
events = sa.Table(
    "hb_events",
    metadata,
    #: insertion order (the order of the deliveries made from it)
    sa.Column("seq", RowId, primary_key=True, autoincrement=True),
    sa.Column("id", EventId, nullable=False, unique=True),
    sa.Column("type", sa.String(32), nullable=False),
    #: what the event is about: deliveries of one subject to one endpoint go in order
    #: ("packet:<id>", "wallet:<user>", "withdrawal:<id>")
    sa.Column("subject", Reference, nullable=False),
    #: the JSON body's "data" object
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Index("ix_events_created", "created_at"),
)

#: where events are delivered, signed per the Standard Webhooks specification
webhook_endpoints = sa.Table(
    "hb_webhook_endpoints",
    metadata,
    sa.Column("id", EndpointId, primary_key=True),
    sa.Column("url", sa.String(2048), nullable=False),
    #: JSON list of the event types it receives
    sa.Column("event_types", sa.Text, nullable=False),
    #: "whsec_" and base64 of the key's bytes
    sa.Column("secret", sa.String(100), nullable=False),
    #: the secret before the last rotation, which also signs until previous_secret_until
    sa.Column("previous_secret", sa.String(100), nullable=True),
    sa.Column("previous_secret_until", Timestamp, nullable=True),
    sa.Column("enabled", sa.Boolean, nullable=False),
    #: why it was disabled (its receiver answered 410 Gone, or an operator)
    sa.Column("disabled_reason", sa.String(200), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    #: the most events one message carries: 1 sends each event alone
    sa.Column("batch_size", sa.Integer, nullable=False, server_default="1"),
)

#: events of one subject to one endpoint: one event, or for an endpoint that takes
#: batches up to its `batch_size` events committed in one transaction; pending until the
#: receiver answers 2xx, parked when its retries run out
webhook_deliveries = sa.Table(
    "hb_webhook_deliveries",
    metadata,
    sa.Column("id", RowId, primary_key=True, autoincrement=True),
    sa.Column("endpoint_id", EndpointId, sa.ForeignKey("hb_webhook_endpoints.id"), nullable=False),
    #: its first event
    sa.Column("event_id", EventId, sa.ForeignKey("hb_events.id"), nullable=False),
    #: the ids of the events after the first, in order, comma-separated (NULL: one event)
    sa.Column("more_event_ids", sa.Text, nullable=True),
    #: how many events it carries
    sa.Column("event_count", sa.Integer, nullable=False, server_default="1"),
    #: the event's subject, copied: the dispatcher sends one subject's deliveries in order
    sa.Column("subject", Reference, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", Timestamp, nullable=False),
    #: a dispatcher holds it until then (another takes over if that one died)
    sa.Column("leased_until", Timestamp, nullable=True),
    #: the dispatcher holding the lease: only it may settle the delivery under that lease
    sa.Column("leased_by", sa.String(40), nullable=True),
    sa.Column("last_status", sa.Integer, nullable=True),
    sa.Column("last_error", sa.String(300), nullable=True),
    sa.Column("delivered_at", Timestamp, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    #: when an operator last put it back in the queue (`hongbao webhooks retry`): its
    #: retries run for the retry window from then, not from created_at
    sa.Column("requeued_at", Timestamp, nullable=True),
    sa.CheckConstraint("status IN ('pending', 'delivered', 'parked')", name="ck_delivery_status"),
    sa.UniqueConstraint("endpoint_id", "event_id", name="uq_delivery_endpoint_event"),
    #: the due ones, oldest first
    sa.Index("ix_deliveries_due", "status", "next_attempt_at"),
    #: the pending deliveries of an (endpoint, subject) in order, and the subjects with
    #: pending deliveries one after another (the queues' heads, see webhook_leases)
    sa.Index("ix_deliveries_queue", "status", "endpoint_id", "subject", "id"),
    #: an event's deliveries: does any remain (pruning), and the foreign key's checks
    sa.Index("ix_deliveries_event", "event_id"),
)
