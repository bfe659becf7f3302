"""Webhooks: endpoints registered by an admin receive the ledger's events, signed per the
Standard Webhooks specification, at least once and in order per subject.

The events are written by the ledger in the transaction of the change they report
(hongbao.ledger.outbox); `Dispatcher` sends them as the messages of
hongbao.webhooks.messages; `WebhookEndpoints` registers receivers.
"""

from hongbao.webhooks.dispatcher import Dispatcher
from hongbao.webhooks.endpoints import (
    AllowedHosts,
    WebhookEndpoints,
    check_event_types,
    check_url,
)
from hongbao.webhooks.messages import message_body, signature_headers

__all__ = [
    "AllowedHosts",
    "Dispatcher",
    "WebhookEndpoints",
    "check_event_types",
    "check_url",
    "message_body",
    "signature_headers",
]
