"""The tables of one store transaction, wired together.

Each table owns the databases it writes, and is given the tables it calls:

    meta      Meta            meta (the staging record among its records)
    copies    Copies          copies, copy_expiry
    bodies    Bodies          bodies                  calls meta
    messages  Messages        expiry, dedupe          calls bodies, copies, meta
    delayed   DelayedEntries  delayed, due
    ready     ReadyQueues     ready                   calls meta
    flights   Flights         inflight, deadlines     calls ready, bodies
    holders   Holders         holders                 calls copies

None is built on another, nor on a base class they share: what they have in
common is the plain functions of store/rows.py. The write transaction (Txn,
store/store.py) and the read one (ReadTxn, store/reader.py) are these same
tables, over an LMDB transaction of each kind.
"""

from __future__ import annotations

from typing import Protocol

import lmdb

from ppmq.store.bodies import Bodies
from ppmq.store.copies import Copies
from ppmq.store.delayed import DelayedEntries
from ppmq.store.flight_index import FlightIndex
from ppmq.store.flights import Flights
from ppmq.store.holders import Holders
from ppmq.store.messages import Messages
from ppmq.store.meta import Meta
from ppmq.store.ready import ReadyQueues
from ppmq.store.ready_tails import ReadyTails
from ppmq.store.room import Room
from ppmq.store.timers import NextTimes


class Opened(Protocol):
    """What the tables need of whatever opened the transaction: a Store, or a StoreReader."""

    copies_seen: bool  # whether any copy may have an expiry of its own (copies.Seen)

    # Read, never set, by the tables: a StoreReader makes them anew at each read.
    @property
    def dbs(self) -> dict[str, lmdb._Database]: ...
    @property
    def flight_index(self) -> FlightIndex:  # which inflight row holds each message in flight (store/flight_index.py)
        ...
    @property
    def ready_tails(self) -> ReadyTails:  # the ready queues kept in memory too (store/ready_tails.py)
        ...
    @property
    def room(self) -> Room:  # what bodies written may have grown the store by (store/room.py)
        ...
    @property
    def times(self) -> NextTimes:  # the soonest time in each timer database (store/timers.py)
        ...


class Tables:
    """The tables of one LMDB transaction."""

    __slots__ = ("meta", "copies", "bodies", "messages", "delayed", "ready", "flights", "holders", "every")

    def __init__(self, opened: Opened, txn: lmdb.Transaction[bytes]) -> None:
        dbs = opened.dbs
        self.meta = meta = Meta(txn, dbs["meta"])
        times = opened.times
        self.copies = copies = Copies(txn, dbs["copies"], dbs["copy_expiry"], opened, times)
        self.bodies = bodies = Bodies(txn, dbs["bodies"], meta, opened.room)
        self.messages = Messages(txn, dbs["expiry"], dbs["dedupe"], bodies, copies, meta, opened.ready_tails, times)
        self.delayed = DelayedEntries(txn, dbs["delayed"], dbs["due"], times)
        self.ready = ready = ReadyQueues(txn, dbs["ready"], meta, opened.ready_tails)
        self.flights = Flights(txn, dbs["inflight"], dbs["deadlines"], ready, bodies, opened.flight_index, times)
        self.holders = Holders(txn, dbs["holders"], copies)
        self.every = (self.meta, copies, bodies, self.messages, self.delayed, ready, self.flights, self.holders)

    def bind(self, txn: lmdb.Transaction[bytes]) -> None:
        """Every table over txn from now on: a savepoint's nested transaction, and back."""
        for table in self.every:
            table.txn = txn
