"""The store: an LMDB environment with ppmq's schema, and the write
transactions the broker composes its operations into.

The layout of every key and value is in store/schema.py; the tables a
transaction is made of (store/tables.py) are the only writers, each of the
databases it owns, and own the rules that tie the databases together: a
message put, replaced or deleted takes its expiry and dedupe entries with it
(store/messages.py), and a copy's own expiry goes with the copy
(store/holders.py), and with its message. Only the writer thread touches the
environment: one Txn is one LMDB write transaction. Readers in other
processes (fsck, reports) use store/reader.py.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import lmdb

from ppmq.errors import StoreError, StoreFullError
from ppmq.store.flight_index import FlightIndex
from ppmq.store.lock import DataPathLock
from ppmq.store.migrate import upgrade
from ppmq.store.ready_tails import ReadyTails
from ppmq.store.room import Room
from ppmq.store.schema import DBS, SCHEMA_VERSION
from ppmq.store.tables import Tables
from ppmq.store.timers import NONE_DUE, UNREAD, NextTimes

DISK_LOW_BYTES = 1 << 20  # a failed commit with less than this free is a full disk (status 507)


def missing_store(path: str) -> str | None:
    """Why `path` holds no store, if it does not (LMDB's data file is not
    there): what the commands that read or convert a store say instead of
    opening one, which would create it."""
    if os.path.isfile(os.path.join(path, "data.mdb")):
        return None
    return f"no ppmq store at {path} (no data.mdb)"


class Store:
    """An LMDB environment with ppmq's schema; `DataPath: mem` uses a temp dir.
    It holds DataPath's lock (store/lock.py) from before it opens anything
    there until it closes, so the journal beside it is this process's too."""

    def __init__(self, data_path: str, *, sync: bool, max_bytes: int) -> None:
        self._tmp = data_path == "mem"
        self.path = tempfile.mkdtemp(prefix="ppmq-mem-") if self._tmp else data_path
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create DataPath {self.path}: {exc.strerror}") from None
        self._lock = None if self._tmp else DataPathLock.take(self.path)
        try:
            self._open(sync, max_bytes)
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise

    def _open(self, sync: bool, max_bytes: int) -> None:
        """The LMDB environment and its databases, under DataPath's lock."""
        self.room = Room(max_bytes)  # whether publishes are refused (status 507), and its limit
        self.migrated = False  # whether opening converted a store an older ppmq wrote
        # Publishes stop at max_bytes (status 507); the headroom lets acks, expiry
        # and deliveries, which also need fresh pages in a copy-on-write tree, go on.
        headroom = max(32 << 20, max_bytes // 20)
        try:
            self.env = lmdb.open(
                self.path,
                map_size=max_bytes + headroom,
                max_dbs=len(DBS),
                sync=sync and not self._tmp,
                metasync=sync and not self._tmp,
                readahead=False,  # the backlog is read in order, and RAM is scarce
                lock=True,
            )
        except lmdb.Error as exc:
            raise StoreError(f"cannot open LMDB environment at {self.path}: {exc}") from None
        self.dbs = {name.decode(): self.env.open_db(name) for name in DBS}
        self.flight_index = FlightIndex()  # in memory, of what the committed rows hold (store/flight_index.py)
        self.ready_tails = ReadyTails()  # in memory, beside the ready rows (store/ready_tails.py)
        self.times = NextTimes()  # in memory, the soonest time of each timer database (store/timers.py)
        self._check_schema()
        # Whether `copies` may have rows (copies.Seen): asked of LMDB once, true
        # from a put on.
        with self.env.begin() as txn:
            self.copies_seen = txn.stat(self.dbs["copies"])["entries"] > 0
            # The block of every write transaction, and its tables: wired once,
            # here, and bound to each write transaction as it begins (Txn).
            self._txn = Txn(self, txn)

    def _check_schema(self) -> None:
        """A new store gets this ppmq's schema; one an older ppmq wrote is
        converted (store/migrate.py) before anything else reads it."""
        try:
            self.migrated = upgrade(self.env, self.dbs, self.path)
        except StoreError:
            self.env.close()
            raise
        except lmdb.Error as exc:
            self.env.close()
            raise StoreError(f"cannot bring the store at {self.path} to schema {SCHEMA_VERSION}: {self.translate(exc)}") from None

    def write(self) -> Txn:
        """One write transaction, `with store.write() as txn:`; committed when
        the block ends without an exception (Txn). One block at a time, as
        LMDB has one write transaction at a time."""
        return self._txn

    def forget(self) -> None:
        """Writes were undone: what memory keeps of the rows goes with them."""
        self.flight_index.clear()
        self.ready_tails.clear()
        self._txn.meta.forget_staged()
        self.room.forget()
        self.times.forget()

    def undo(self, txn: lmdb.Transaction, exc: BaseException) -> None:
        """Abort txn (a step's, or a savepoint's), which `exc` ended, and forget
        what memory keeps of its rows; an LMDB error goes on as the store's own."""
        txn.abort()
        self.forget()
        if isinstance(exc, lmdb.Error):
            raise self.translate(exc) from None

    def committed_meta(self, name: bytes) -> bytes | None:
        """A meta record as the last commit left it (in a read transaction of its own)."""
        with self.env.begin(db=self.dbs["meta"]) as txn:
            return txn.get(name)

    def translate(self, exc: lmdb.Error) -> StoreError:
        """The store's error for an LMDB one: every way of running out of room
        (LMDB's map, or the disk under it) is a StoreFullError (status 507)."""
        if isinstance(exc, lmdb.MapFullError):
            return StoreFullError("LMDB map is full")
        free = self._disk_free_bytes()
        if free < DISK_LOW_BYTES or os.strerror(errno.ENOSPC) in str(exc):
            return StoreFullError(f"disk full: {free} bytes left on the device of {self.path} ({exc})")
        return StoreError(f"store error: {exc}")

    def _disk_free_bytes(self) -> int:
        """A commit cut short by a full disk fails with EIO as often as with ENOSPC
        (LMDB reports a short write as EIO), so the disk itself is asked."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def clear_stale_readers(self) -> int:
        """Free the reader slots of processes that died inside a read transaction
        (a report or fsck killed mid-read): until then LMDB keeps every page those
        readers could see, so freed pages are never reused and the file grows to
        map full. Returns how many slots were freed."""
        try:
            return self.env.reader_check()
        except lmdb.Error:
            return 0

    def close(self) -> None:
        self.env.close()
        if self._lock is not None:
            self._lock.release()
        if self._tmp:
            shutil.rmtree(self.path, ignore_errors=True)


class Txn:
    """The write transaction in progress: its tables (store/tables.py), the
    operations the broker composes into it, and what concerns the transaction
    as a whole (a savepoint, the room left in the store). Also the block of
    every write transaction (Store.write): begun on entry, committed on a
    clean exit, aborted otherwise.

    Each operation the broker calls is the method of the table that does it,
    assigned here as an attribute, so that the broker names the operation
    rather than the table. Such a call costs a little more than one made on
    the table itself: the interpreter does not specialise a call of a bound
    method kept on an instance. A store wires its Txn once, when it opens, and
    binds it to each write transaction as it begins (__enter__): wiring eight
    tables and assigning their operations at every step would cost the writer
    more than the rest of a transaction's setting up. So a Txn kept past its
    block works on a transaction that has ended, which LMDB refuses, until the
    store's next one begins.

    LMDB's errors, from the block or from the commit, leave as StoreFullError
    (no room: map full or disk full) or StoreError, so callers above the
    store never see lmdb's exception types."""

    def __init__(self, store: Store, txn: lmdb.Transaction[bytes]) -> None:
        self.store = store
        self.txn = txn
        self.tables = tables = Tables(store, txn)
        self.meta = meta = tables.meta
        self.copies = copies = tables.copies
        self.bodies = bodies = tables.bodies
        self.messages = messages = tables.messages
        self.delayed = delayed = tables.delayed
        self.ready = ready = tables.ready
        self.flights = flights = tables.flights
        self.holders = holders = tables.holders
        self.get_meta, self.delete_meta, self.meta_items = meta.get, meta.delete, meta.items
        # Meta's put, bound to each transaction (_bind): a cursor's, which takes the
        # database from its cursor, where a partial passing db= would build a dict
        # of keywords for py-lmdb to parse at every record the counters write.
        self.put_meta = txn.cursor(meta.db).put
        self.staged, self.put_staged = meta.staged, meta.put_staged
        self.put_copy_expiry, self.copy_expiries_of, self.copy_expiries = copies.put, copies.of_message, copies.of_subscriber
        self.drop_copy_expiries, self.due_copy_expiries, self.next_copy_expiry_ns = copies.drop, copies.due, copies.next_ns
        self.get_body, self.publish_ns, self.put_body, self.put_records = bodies.get, bodies.publish_ns, bodies.put, bodies.put_records
        self.pop_bodies, self.bodies_of, self.staged_ids = bodies.pop, bodies.of, bodies.staged_ids
        self.put_messages, self.replace_message, self.delete_messages = messages.put, messages.replace, messages.delete
        self.add_expiry, self.remove_expiry = messages.add_expiry, messages.remove_expiry
        self.due_expiries, self.next_expiry_ns = messages.due_expiries, messages.next_expiry_ns
        self.get_dedupe, self.dedupe_ids = messages.dedupe_id, messages.dedupe_ids
        self.push_delayed, self.pop_delayed, self.delayed_of = delayed.push, delayed.pop, delayed.of
        self.due_delayed, self.next_due_ns = delayed.due, delayed.next_due_ns
        self.push_ready, self.push_fresh, self.push_ready_many = ready.push, ready.push_fresh, ready.push_many
        self.remove_ready, self.ready_attempts, self.restart_ready, self.pop_ready = ready.remove, ready.attempts, ready.restart, ready.pop
        self.pull_ready, self.ready_of, self.first_ready = ready.pull, ready.of, ready.first
        self.take_ready, self.watch_flights, self.put_flight, self.ack_flights = flights.take_ready, flights.watch, flights.put, flights.ack
        self.retime_flights, self.pop_flight, self.get_inflight, self.inflight_of = flights.retime, flights.pop, flights.get, flights.of
        self.due_deadlines, self.next_deadline_ns = flights.due, flights.next_deadline_ns
        self.get_holders, self.put_holders, self.put_new_holders = holders.get, holders.put, holders.put_new
        self.release_holders, self.pop_holders = holders.release, holders.pop
        # refuse_when_full(now_ns): a publish, or a staged publish's next chunk,
        # is refused (StoreFull, 507) while the store is full (store/room.py),
        # counted by this transaction.
        self.refuse_when_full = partial(store.room.refuse_when_full, self.used_bytes)

    def __enter__(self) -> Txn:
        """The same tables, over the store's next write transaction, without the
        watch the one before was given. What the tables keep in memory of the
        rows (the staging record among them) stays true across commits."""
        self.txn = txn = self.store.env.begin(write=True)
        for table in self.tables.every:  # _bind's, without a call of its own: every step begins here
            table.txn = txn
        self.put_meta = txn.cursor(self.meta.db).put
        self.flights.watching = None
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        store, txn = self.store, self.txn
        if exc is not None:
            store.undo(txn, exc)
            return
        try:
            txn.commit()
        except lmdb.Error as error:
            store.forget()
            raise store.translate(error) from None

    def _bind(self, txn: lmdb.Transaction[bytes]) -> None:
        """Every table over txn from now on: a savepoint's nested transaction, and back."""
        self.txn = txn
        self.tables.bind(txn)
        self.put_meta = txn.cursor(self.meta.db).put

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested transaction: the block's writes vanish if it raises."""
        watch = self.flights.watching
        outer, noted = self.txn, watch.mark() if watch is not None else 0
        inner = self.store.env.begin(write=True, parent=outer)
        self._bind(inner)
        try:
            yield
        except BaseException as exc:
            if watch is not None:
                watch.undo(noted)
            self.store.undo(inner, exc)
            raise
        else:
            inner.commit()
        finally:
            self._bind(outer)
            self.meta.forget_staged()  # the block may have changed the staging record

    def next_timer_ns(self) -> int | None:
        """When the soonest timer comes due: a message's or a copy's expiry, an
        AckRetry deadline, a delayed entry; None if none waits. Answered from
        memory (store/timers.py): a database is read only when its soonest entry
        went and the next one is not known."""
        times = self.store.times
        if times.expiry == times.copy_expiry == times.deadline == times.due == NONE_DUE:  # no timer in use
            return None
        soonest = min(times.expiry, times.copy_expiry, times.deadline, times.due)
        if soonest == UNREAD:
            self.next_expiry_ns(), self.next_copy_expiry_ns(), self.next_deadline_ns(), self.next_due_ns()
            soonest = min(times.expiry, times.copy_expiry, times.deadline, times.due)
        return None if soonest == NONE_DUE else soonest

    def used_bytes(self) -> int:
        """Pages in use by every database (freed pages are reused, so not counted)."""
        main = self.txn.stat()
        pages = main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]
        for db in self.store.dbs.values():
            s = self.txn.stat(db)
            pages += s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]
        return pages * main["psize"]

    def full(self) -> bool:
        """Whether the store has reached MaxStoreBytes: publishes are refused (store/room.py)."""
        return self.store.room.full(self.used_bytes)
