"""The SQL ledger: wallets, packets, shares, claims. The source of truth for money."""

from hongbao.ledger.sql import SqlLedger, database_url

__all__ = ["SqlLedger", "database_url"]
