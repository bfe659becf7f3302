"""Keeps credentials out of the logs: ``token=`` and ``ticket=`` query values are masked.

uvicorn's access log prints each request's path with its query string; a bearer token
or an event-stream ticket sent there would be written to disk with it.
"""

from __future__ import annotations

import logging
import re

#: a token= or ticket= parameter's value in a query string (or anywhere in a log line)
_CREDENTIAL = re.compile(r"((?:^|[?&;\s])(?:token|ticket)=)[^&;#\s\"]*", re.IGNORECASE)
MASK = "[redacted]"
#: the loggers that print request targets
LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    """`text` with the values of its token= and ticket= parameters masked."""
    return _CREDENTIAL.sub(lambda m: m.group(1) + MASK, text)


class RedactCredentials(logging.Filter):
    """Masks token= and ticket= values in a record's message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, str) for a in args):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in args)
        return True


def install() -> None:
    """Add the filter to uvicorn's loggers (once, however often it is called)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactCredentials) for f in logger.filters):
            logger.addFilter(RedactCredentials())
