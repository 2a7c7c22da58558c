"""Every exception ppmq raises, in one hierarchy under `PpmqError`.

A request's error is a `RequestError`: one class per reply status (PROTOCOL §4),
the status a class attribute, so that whoever answers a request reads it from
the class and no code elsewhere spells a status for an error. The other errors
stop one thing short of a reply: a config that cannot be used, a socket that
cannot be bound, a store that cannot be opened, a PHPMQ frame that closes its
connection, a client that the broker refused, a command that failed. Each is
translated where it crosses a boundary (`raise X(...) from None`), so that a
caller catches ppmq's classes, never lmdb's, yaml's or the socket module's.

This module imports nothing from ppmq: every layer may raise what it defines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from msgspec import Raw, UnsetType


class PpmqError(Exception):
    """The root of ppmq's own exceptions: catching it catches any of them."""


# --- a request's error becomes its reply (PROTOCOL §4) -------------------------------------


class RequestError(PpmqError):
    """A request failed; `status` and the message become its reply. The base of
    one class per status, which is what code raises and catches: catching
    RequestError catches every error that has a reply."""

    status = 500


class BadRequest(RequestError):
    """The request is malformed or asks for something impossible: a frame that
    is not JSON, a field out of range, an unknown command. Raised while a frame
    is decoded (then with the frame's `request_id` attached when it has one)
    or validated, or while the broker applies the request."""

    status = 400
    request_id: Raw | UnsetType  # set on an error of decoding only


class Forbidden(RequestError):
    """The peer's credentials (SO_PEERCRED) do not allow the request (PROTOCOL §8 Access)."""

    status = 403


class NotFound(RequestError):
    """The request names a topic or a subscriber the config in force does not
    have, or a subscriber that does not take the topic it names."""

    status = 404


class ReadTimeout(RequestError):
    """A frame did not arrive whole within ReadTimeout of its first byte."""

    status = 408


class TooLarge(RequestError):
    """A frame exceeds MaxFrameBytes, a message MaxMessageBytes, or a publish
    more than the store can stage."""

    status = 413


class Internal(RequestError):
    """The broker failed on a request, not the request: a bug met while applying
    it (an exception no handler expects, whose traceback is logged; the request
    alone is undone), a commit that failed for another reason than room, a
    reload that failed unexpectedly."""

    status = 500


class Unavailable(RequestError):
    """The broker cannot take the request now: too many connections, or a topic
    reconfigured while a large publish to it was being stored."""

    status = 503


class ShuttingDown(Unavailable):
    """The broker is stopping: a request that arrived after the stop began."""


class StoreFull(RequestError):
    """The store, or the topic the request publishes to, is out of room
    (MaxStoreBytes, a topic's MaxBytes or MaxMessages, LMDB's map, the disk)."""

    status = 507


# --- configuration, sockets, the store ------------------------------------------------------


class ConfigError(PpmqError):
    """The config cannot be used: a file that does not parse or validate, or a
    reload the running broker refuses (it would drop messages). `errors` holds
    one line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


class ListenError(PpmqError):
    """A socket cannot be listened on (the path is taken, or the OS says no)."""


class StoreError(PpmqError):
    """The store cannot be opened or used: locked by another process, not a ppmq
    store, of another schema, damaged, or a commit that failed."""


class StoreFullError(StoreError):
    """LMDB's map, or the disk under it, is full: the transaction was rolled back."""


class FsckError(PpmqError):
    """`ppmq fsck` cannot check the store at all (exit status 2)."""


# --- PHPMQ (PROTOCOL §9): errors that close the connection -----------------------------------


class BadFrame(PpmqError):
    """Bytes that are not a PHPMQ frame a client may send, or a frame the broker
    cannot act on; the text says why."""


class FrameTooLarge(BadFrame):
    """A PHPMQ frame longer than MaxFrameBytes."""


class UnknownQueue(BadFrame):
    """A PHPMQ frame names a queue that is no topic of the config in force."""


class Refused(PpmqError):
    """The broker answered a PHPMQ request with an error; the text says which."""


# --- the client side ------------------------------------------------------------------------


class ClientError(PpmqError):
    """The broker answered a client's request with an error status, or could not be reached."""

    def __init__(self, status: int, error: str) -> None:
        """`status` is the broker's, or 0 when the broker could not be asked."""
        super().__init__(f"{status}: {error}" if status else error)
        self.status = status
        self.error = error


class SubscriberError(PpmqError):
    """The subscriber kit cannot run: unknown name, unusable socket, bad settings,
    a frame from the broker too large."""


# --- the command line, the Spark side, the bench -------------------------------------------


class Failure(PpmqError):
    """A `ppmq` command could not do its job: message on stderr, exit 1."""


class ManPageError(PpmqError):
    """The man pages cannot be made (a config key without documentation)."""


class PublishError(PpmqError):
    """The broker refused a batch a DataFrame's partition published; the message is the broker's."""


class SnapshotGone(PpmqError):
    """A partition's snapshot copy of the store is gone, or is not the snapshot planned."""


class StartError(PpmqError):
    """A broker under `ppmq bench` did not come up; the message ends with its log."""


class RunError(PpmqError):
    """A bench run did not finish: a client failed or messages never arrived."""
