"""ppmq's client side: the client library (`Client`, `AsyncClient`), the results it
returns, and the subscriber kit."""

from ppmq.client.library import AsyncClient, Client
from ppmq.client.results import (
    Message,
    Origin,
    PeekedMessage,
    PeekResult,
    PingResult,
    PublishResult,
    PurgeResult,
    RedriveResult,
    SettleResult,
    Status,
    SubscriberStatus,
    TopicStatus,
)
from ppmq.errors import ClientError

__all__ = [
    "AsyncClient",
    "Client",
    "ClientError",
    "Message",
    "Origin",
    "PeekResult",
    "PeekedMessage",
    "PingResult",
    "PublishResult",
    "PurgeResult",
    "RedriveResult",
    "SettleResult",
    "Status",
    "SubscriberStatus",
    "TopicStatus",
]
