"""ppmq's client side: the client library (`Client`, `AsyncClient`) and the subscriber kit."""

from ppmq.client.library import AsyncClient, Client
from ppmq.errors import ClientError

__all__ = ["AsyncClient", "Client", "ClientError"]
