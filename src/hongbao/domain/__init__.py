"""Pure domain code: money, splitting, value types. No I/O here."""
