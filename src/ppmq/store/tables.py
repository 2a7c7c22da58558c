"""The tables of one store transaction, wired together.

A table owns the databases it writes and is given the tables it calls (see
Tables below for which is which); none is built on another, and none on a
base class they share: the row helpers they have in common are the plain
functions of rows.py. The write transaction (store.Txn) and the read one
(reader.ReadTxn) are the same tables over an LMDB transaction of each kind.
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
from ppmq.store.meta import Meta
from ppmq.store.ready import ReadyQueues
from ppmq.store.ready_tails import ReadyTails
from ppmq.store.room import Room


class Opened(Protocol):
    """What the rows of a transaction need of whatever opened it: a Store, or a StoreReader."""

    dbs: dict[str, lmdb._Database]
    flight_index: FlightIndex
    ready_tails: ReadyTails
    copies_seen: bool  # copies.Seen
    room: Room


class Rows:
    """The databases of one LMDB transaction, and the tables made of some of them."""

    def __init__(self, store: Opened, txn: lmdb.Transaction[bytes]) -> None:
        self.store = store
        self.txn = txn
        d = store.dbs
        self.delayed = delayed = DelayedEntries(txn, d["delayed"], d["due"])
        self.push_delayed, self.pop_delayed, self.delayed_of = delayed.push, delayed.pop, delayed.of
        self.due_delayed, self.next_due_ns = delayed.due, delayed.next_due_ns
        self._expiry, self._dedupe = d["expiry"], d["dedupe"]
        self.meta = meta = Meta(txn, d["meta"])
        self.get_meta, self.put_meta, self.delete_meta, self.meta_items = meta.get, meta.put, meta.delete, meta.items
        self.staged, self.put_staged = meta.staged, meta.put_staged
        self.copies = copies = Copies(txn, d["copies"], d["copy_expiry"], store)
        self.put_copy_expiry, self.copy_expiries_of, self.copy_expiries = copies.put, copies.of_message, copies.of_subscriber
        self.drop_copy_expiries, self.due_copy_expiries, self.next_copy_expiry_ns = copies.drop, copies.due, copies.next_ns
        self.bodies = bodies = Bodies(txn, d["bodies"], meta, store.room)
        self.get_body, self.publish_ns, self.put_body, self.put_records = bodies.get, bodies.publish_ns, bodies.put, bodies.put_records
        self.pop_bodies, self.bodies_of, self.staged_ids = bodies.pop, bodies.of, bodies.staged_ids
        self.ready = ready = ReadyQueues(txn, d["ready"], meta, store.ready_tails)
        self.push_ready, self.push_fresh, self.push_ready_many = ready.push, ready.push_fresh, ready.push_many
        self.remove_ready, self.ready_attempts, self.restart_ready, self.pop_ready = ready.remove, ready.attempts, ready.restart, ready.pop
        self.pull_ready, self.ready_of, self.first_ready = ready.pull, ready.of, ready.first
        self.flights = flights = Flights(txn, d["inflight"], d["deadlines"], ready, bodies, store.flight_index)
        self.take_ready, self.watch_flights, self.put_flight, self.ack_flights = flights.take_ready, flights.watch, flights.put, flights.ack
        self.retime_flights, self.pop_flight, self.get_inflight, self.inflight_of = flights.retime, flights.pop, flights.get, flights.of
        self.due_deadlines, self.next_deadline_ns = flights.due, flights.next_deadline_ns
        self.holders = holders = Holders(txn, d["holders"], copies)
        self.get_holders, self.put_holders, self.put_new_holders = holders.get, holders.put, holders.put_new
        self.release_holders, self.pop_holders = holders.release, holders.pop
        self._tables = [meta, copies, delayed, bodies, ready, flights, holders]

    def bind(self, txn: lmdb.Transaction[bytes]) -> None:
        """Every table over txn (a savepoint's nested transaction, and back)."""
        self.txn = txn
        for table in self._tables:
            table.txn = txn
