"""The operations the broker composes into LMDB write transactions.

The layout of every key and value is in schema.py; this module is the only
writer, and owns the rules that tie the databases together: a message put,
replaced or deleted takes its expiry and dedupe entries with it. Only the
writer thread touches the environment: one Txn is one LMDB write transaction.
Readers in other processes (fsck, reports) use reader.py.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from operator import itemgetter
from typing import TYPE_CHECKING

import lmdb

from .migrate import upgrade
from .schema import (
    BODY_HEAD,
    Body,
    DBS,
    DTSM,
    ETM,
    FLIGHT,
    Flight,
    Gone,
    HOLDER,
    READY_VAL,
    ReadyEntry,
    SCHEMA_VERSION,
    STAGED,
    STAGING_KEY,
    Staged,
    StoreError,
    StoreFullError,
    TM,
    TS,
    TSM,
    TSPQ,
    Taken,
    U64,
    decode_body,
    encode_body,
    u32,
)

if TYPE_CHECKING:
    from .reader import StoreReader

DISK_LOW_BYTES = 1 << 20  # a failed commit with less than this free is a full disk (status 507)

class Store:
    """An LMDB environment with ppmq's schema; `DataPath: mem` uses a temp dir."""

    def __init__(self, data_path: str, *, sync: bool, max_bytes: int) -> None:
        self._tmp = data_path == "mem"
        self.path = tempfile.mkdtemp(prefix="ppmq-mem-") if self._tmp else data_path
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create DataPath {self.path}: {exc.strerror}") from None
        self.max_bytes = max_bytes
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
        self._check_schema()

    def _check_schema(self) -> None:
        """A new store gets this ppmq's schema; one an older ppmq wrote is
        converted (migrate.py), in this one transaction."""
        with self.env.begin(write=True) as txn:
            found = txn.get(b"schema", db=self.dbs["meta"])
            if found is None:
                txn.put(b"schema", b"%d" % SCHEMA_VERSION, db=self.dbs["meta"])
            else:
                self.migrated = upgrade(txn, self.dbs, int(found), self.path)

    @contextmanager
    def write(self) -> Iterator[Txn]:
        """One write transaction; committed when the block ends without an exception.

        LMDB's errors, from the block or from the commit, leave as StoreFullError
        (no room: map full or disk full) or StoreError, so callers above the
        store never see lmdb's exception types."""
        txn = self.env.begin(write=True)
        try:
            yield Txn(self, txn)
        except BaseException as exc:
            txn.abort()
            if isinstance(exc, lmdb.Error):
                raise self.translate(exc) from None
            raise
        try:
            txn.commit()
        except lmdb.Error as exc:
            raise self.translate(exc) from None

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
        if self._tmp:
            shutil.rmtree(self.path, ignore_errors=True)


class Txn:
    """Typed operations inside one write transaction (or, from a StoreReader, reads in a read one)."""

    def __init__(self, store: Store | StoreReader, txn: lmdb.Transaction) -> None:
        self.store = store
        self.txn = txn
        d = store.dbs
        self._bodies, self._holders, self._ready = d["bodies"], d["holders"], d["ready"]
        self._inflight, self._deadlines = d["inflight"], d["deadlines"]
        self._expiry, self._dedupe, self._meta = d["expiry"], d["dedupe"], d["meta"]
        self._staged: Staged | None | bool = False  # False: meta `staging` not read yet

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested transaction: the block's writes vanish if it raises."""
        outer = self.txn
        self.txn = self.store.env.begin(write=True, parent=outer)
        try:
            yield
        except BaseException as exc:
            self.txn.abort()
            if isinstance(exc, lmdb.Error) and isinstance(self.store, Store):
                raise self.store.translate(exc) from None
            raise
        else:
            self.txn.commit()
        finally:
            self.txn = outer
            self._staged = False  # the block may have changed the staging record

    def used_bytes(self) -> int:
        """Pages in use by every database (freed pages are reused, so not counted)."""
        main = self.txn.stat()
        pages = main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]
        for db in self.store.dbs.values():
            s = self.txn.stat(db)
            pages += s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]
        return pages * main["psize"]

    def _put_in_order(self, key: bytes, value: bytes, db: lmdb._Database) -> None:
        """Put a key that is usually the largest in its database so far.

        MDB_APPEND fills pages to the brim where LMDB would otherwise split them
        in half, which halves the disk and page cache a backlog takes; a key that
        is not the largest is refused by it, and then put the ordinary way.
        """
        if not self.txn.put(key, value, db=db, append=True):
            self.txn.put(key, value, db=db)

    def _put_all_in_order(self, items: list[tuple[bytes, bytes]], db: lmdb._Database) -> None:
        """`_put_in_order` for a whole batch in two calls at most: the entries
        above the database's last key are appended, the others (a batch of
        several priorities, most often) put the ordinary way."""
        items.sort()
        with self.txn.cursor(db=db) as cur:
            last = cur.key() if cur.last() else b""
            i = bisect_right(items, last, key=itemgetter(0))
            if i:
                cur.putmulti(items[:i])
            if i < len(items):
                cur.putmulti(items[i:], append=True)

    # --- meta ---------------------------------------------------------------------
    def get_meta(self, name: bytes) -> bytes | None:
        return self.txn.get(name, db=self._meta)

    def put_meta(self, name: bytes, value: bytes) -> None:
        self.txn.put(name, value, db=self._meta)

    # --- the staging record ------------------------------------------------------
    def staged(self) -> Staged | None:
        """The range a publish in progress hides, read once per transaction: the
        walks below ask for it at every step."""
        if self._staged is False:
            raw = self.get_meta(STAGING_KEY)
            self._staged = Staged._make(STAGED.unpack(raw)) if raw is not None else None
        return self._staged

    def put_staged(self, staged: Staged | None) -> None:
        if staged is None:
            self.txn.delete(STAGING_KEY, db=self._meta)
        else:
            self.put_meta(STAGING_KEY, STAGED.pack(*staged))
        self._staged = staged

    def staged_ids(self, staged: Staged, limit: int) -> list[int]:
        """Up to `limit` ids of stored messages in the staged range, lowest first."""
        out = []
        with self.txn.cursor(db=self._bodies) as cur:
            if cur.set_range(TM.pack(staged.t, staged.first)):
                for key in cur.iternext(values=False):
                    t, m = TM.unpack(key)
                    if t != staged.t or m > staged.last or len(out) >= limit:
                        break
                    out.append(m)
        return out

    # --- bodies -------------------------------------------------------------------
    def get_body(self, t: int, m: int) -> Body | None:
        return decode_body(self.txn.get(TM.pack(t, m), db=self._bodies))

    def publish_ns(self, t: int, m: int) -> int:
        """When m was published (0 if it is gone); reads the header only."""
        raw = self.txn.get(TM.pack(t, m), db=self._bodies)
        return 0 if raw is None else BODY_HEAD.unpack_from(raw)[1]

    def put_body(self, t: int, m: int, body: Body) -> None:
        self._put_in_order(TM.pack(t, m), encode_body(body), self._bodies)

    def put_bodies(self, t: int, bodies: list[tuple[int, Body]]) -> None:
        self._put_all_in_order([(TM.pack(t, m), encode_body(body)) for m, body in bodies], self._bodies)

    def put_messages(self, t: int, bodies: list[tuple[int, Body]], *, dedupe: bool, expire: bool) -> None:
        """New messages with their index entries: the dedupe key of each on a
        Dedupe topic, its expiry on an Expire topic."""
        self.put_bodies(t, bodies)
        for m, body in bodies if dedupe or expire else ():
            if dedupe:
                self.put_dedupe(t, body.key, m)
            if expire and body.expires_ns:
                self.add_expiry(body.expires_ns, t, m)

    def replace_message(self, t: int, m: int, body: Body, *, expire: bool) -> Body | None:
        """A new version of m (its dedupe key is the same); returns the old one."""
        old = self.get_body(t, m)
        if old is not None and old.expires_ns:
            self.remove_expiry(old.expires_ns, t, m)
        self.put_body(t, m, body)
        if expire and body.expires_ns:
            self.add_expiry(body.expires_ns, t, m)
        return old

    def delete_messages(self, t: int, ms: list[int], *, dedupe: bool) -> list[Gone]:
        """`delete_message` for each of ms; what was deleted."""
        return [gone for m in ms if (gone := self.delete_message(t, m, dedupe=dedupe)) is not None]

    def delete_message(self, t: int, m: int, *, dedupe: bool) -> Gone | None:
        """Delete m with its index entries; what was deleted, or None if m was not stored."""
        gone = self.delete_body(t, m)
        if gone is not None:
            if gone.expires_ns:
                self.remove_expiry(gone.expires_ns, t, m)
            if dedupe:
                self.delete_dedupe(t, gone.key)
        return gone

    def delete_body(self, t: int, m: int) -> Gone | None:
        """Delete m; return what its indexes and counters need, or None if it was
        not stored. On the path of every last ack, so the body is not copied."""
        raw = self.txn.pop(TM.pack(t, m), db=self._bodies)
        if raw is None:
            return None
        _, _, expires_ns, klen = BODY_HEAD.unpack_from(raw)
        start = BODY_HEAD.size
        return Gone(expires_ns, raw[start : start + klen], len(raw) - start - klen)

    def bodies_of(self, t: int) -> Iterator[tuple[int, Body]]:
        """Every stored message of topic t, by id; none of a publish being staged."""
        prefix = u32(t)
        staged = self.staged()
        with self.txn.cursor(db=self._bodies) as cur:
            if cur.set_range(prefix):
                for key, raw in cur:
                    if key[:4] != prefix:
                        break
                    m = TM.unpack(key)[1]
                    if staged is None or not staged.hides(t, m):
                        yield m, decode_body(raw)

    # --- holders: which subscribers still have a message, and at which place -------
    def get_holders(self, t: int, m: int) -> dict[int, tuple[int, int]]:
        raw = self.txn.get(TM.pack(t, m), db=self._holders)
        if raw is None:
            return {}
        return {s: (p, pos) for s, p, pos in HOLDER.iter_unpack(raw)}

    def put_holders(self, t: int, m: int, holders: dict[int, tuple[int, int]]) -> None:
        key = TM.pack(t, m)
        if holders:
            raw = b"".join(HOLDER.pack(s, p, pos) for s, (p, pos) in holders.items())
            self.txn.put(key, raw, db=self._holders)
        else:
            self.txn.delete(key, db=self._holders)

    def put_new_holders(self, t: int, subs: list[int], msgs: list[tuple[int, int]]) -> None:
        """Every subscriber in subs holds each new (m, prio) at position m."""
        items = [(TM.pack(t, m), b"".join([HOLDER.pack(s, prio, m) for s in subs])) for m, prio in msgs]
        self._put_all_in_order(items, self._holders)

    def release_holders(self, t: int, s: int, ms: list[int]) -> list[int]:
        """Remove s from the holders of each of ms; return those nobody holds any more.

        The path of every ack, so it splices bytes instead of decoding them.
        """
        get, put, delete, db, key_of = self.txn.get, self.txn.put, self.txn.delete, self._holders, TM.pack
        sub, size = s.to_bytes(2, "big"), HOLDER.size
        done = []
        for m in ms:
            key = key_of(t, m)
            raw = get(key, db=db)
            if raw is not None:
                for i in range(0, len(raw), size):
                    if raw[i : i + 2] == sub:
                        raw = raw[:i] + raw[i + size :]
                        break
                if raw:
                    put(key, raw, db=db)
                    continue
                delete(key, db=db)
            done.append(m)
        return done

    # --- ready queues ---------------------------------------------------------------
    def push_ready(self, t: int, s: int, prio: int, pos: int, m: int, attempts: int) -> None:
        self._put_in_order(TSPQ.pack(t, s, prio, pos), READY_VAL.pack(m, attempts), self._ready)

    def push_ready_many(self, t: int, s: int, entries: list[tuple[int, int, int]]) -> None:
        """(prio, pos, m) entries, first attempts, into s's queue in one call."""
        items = [(TSPQ.pack(t, s, prio, pos), READY_VAL.pack(m, 0)) for prio, pos, m in entries]
        self._put_all_in_order(items, self._ready)

    def remove_ready(self, t: int, s: int, prio: int, pos: int) -> bool:
        return self.txn.delete(TSPQ.pack(t, s, prio, pos), db=self._ready)

    def ready_attempts(self, t: int, s: int, prio: int, pos: int) -> int | None:
        """Deliveries so far of the ready entry at (prio, pos), or None if there is none."""
        raw = self.txn.get(TSPQ.pack(t, s, prio, pos), db=self._ready)
        return None if raw is None else READY_VAL.unpack(raw)[1]

    def pop_ready(self, t: int, s: int, prio: int, pos: int) -> int | None:
        """Remove a ready entry; return its attempts so far, or None if there was none."""
        raw = self.txn.pop(TSPQ.pack(t, s, prio, pos), db=self._ready)
        return None if raw is None else READY_VAL.unpack(raw)[1]

    def pull_ready(self, t: int, s: int, limit: int, take: Callable[[ReadyEntry], bool]) -> int:
        """Walk s's queue on t by priority then position, deleting each entry that
        `take` accepts, until `limit` are taken; return how many were taken.
        A staged publish's entries (one run of positions per priority) are jumped over."""
        prefix = TS.pack(t, s)
        staged = self.staged()
        taken = 0
        with self.txn.cursor(db=self._ready) as cur:
            positioned = cur.set_range(prefix)
            while positioned and taken < limit:
                key = cur.key()
                if key[:6] != prefix:
                    break
                _, _, prio, pos = TSPQ.unpack(key)
                if staged is not None and staged.hides(t, pos):
                    positioned = cur.set_range(TSPQ.pack(t, s, prio, staged.last + 1))
                    continue
                m, attempts = READY_VAL.unpack(cur.value())
                if take(ReadyEntry(prio, pos, m, attempts)):
                    taken += 1
                    positioned = cur.delete() and bool(cur.key())
                else:
                    positioned = cur.next()
        return taken

    def take_ready(self, t: int, s: int, limit: int, deadline_ns: int, expired_at_ns: int) -> tuple[list[Taken], list[int], list[int]]:
        """A batch for s: up to `limit` entries of its queue on t, by priority then
        position, moved into flight with the AckRetry deadline `deadline_ns`.
        Returns what was taken; the ids of messages expired at `expired_at_ns`
        (0: none expire), left where they are; and the priorities of entries
        whose message is missing (a damaged store), deleted. One cursor walk and
        one write of the in-flight rows: the path of every backlog."""
        prefix, head_size = TS.pack(t, s), BODY_HEAD.size
        ready_key, ready_value, body_key, head = TSPQ.unpack, READY_VAL.unpack, TM.pack, BODY_HEAD.unpack_from
        get, bodies, staged = self.txn.get, self._bodies, self.staged()
        taken: list[Taken] = []
        expired: list[int] = []
        missing: list[int] = []
        with self.txn.cursor(db=self._ready) as cur:
            positioned = cur.set_range(prefix)
            while positioned and len(taken) < limit:
                key = cur.key()
                if key[:6] != prefix:
                    break
                _, _, prio, pos = ready_key(key)
                if staged is not None and staged.hides(t, pos):
                    positioned = cur.set_range(TSPQ.pack(t, s, prio, staged.last + 1))
                    continue
                m, attempts = ready_value(cur.value())
                raw = get(body_key(t, m), db=bodies)
                if raw is None:
                    missing.append(prio)
                else:
                    _, publish_ns, expires_ns, klen = head(raw)
                    if 0 < expires_ns <= expired_at_ns:
                        expired.append(m)
                        positioned = cur.next()
                        continue
                    taken.append(Taken(prio, pos, m, attempts + 1, publish_ns, raw[head_size + klen :]))
                positioned = cur.delete() and bool(cur.key())
        flight, key_of = FLIGHT.pack, TSM.pack
        self._put_all_in_order([(key_of(t, s, x.m), flight(x.prio, x.pos, deadline_ns, x.attempts, x.publish_ns)) for x in taken], self._inflight)
        if deadline_ns:
            for x in taken:
                self.txn.put(DTSM.pack(deadline_ns, t, s, x.m), b"", db=self._deadlines)
        return taken, expired, missing

    def first_ready(self, t: int, s: int, prio: int) -> ReadyEntry | None:
        """The head of s's queue of priority prio, a staged publish's entries left out."""
        prefix = TSPQ.pack(t, s, prio, 0)[:7]
        staged = self.staged()
        with self.txn.cursor(db=self._ready) as cur:
            if not cur.set_range(prefix) or cur.key()[:7] != prefix:
                return None
            _, _, p, pos = TSPQ.unpack(cur.key())
            if staged is not None and staged.hides(t, pos):
                if not cur.set_range(TSPQ.pack(t, s, prio, staged.last + 1)) or cur.key()[:7] != prefix:
                    return None
                _, _, p, pos = TSPQ.unpack(cur.key())
            m, attempts = READY_VAL.unpack(cur.value())
            return ReadyEntry(p, pos, m, attempts)

    # --- in flight --------------------------------------------------------------------
    def put_first_flights(self, t: int, s: int, msgs: list[tuple[int, int]], deadline_ns: int, publish_ns: int) -> None:
        """A whole batch's first deliveries to s of messages published at
        publish_ns: (m, prio), each at its place (prio, m)."""
        key, value = TSM.pack, FLIGHT.pack
        self._put_all_in_order([(key(t, s, m), value(prio, m, deadline_ns, 1, publish_ns)) for m, prio in msgs], self._inflight)
        if deadline_ns:
            for m, _ in msgs:
                self.txn.put(DTSM.pack(deadline_ns, t, s, m), b"", db=self._deadlines)

    def pop_flights(self, t: int, s: int, ms: list[int]) -> list[tuple[int, int] | None]:
        """Take each of ms out of flight to s, with its deadline entry; per m, its
        (deliveries so far, publish_ns), or None if it was not in flight. The
        path of every ack: one call a batch, and no Flight built."""
        pop, delete, key, db = self.txn.pop, self.txn.delete, TSM.pack, self._inflight
        out: list[tuple[int, int] | None] = []
        for m in ms:
            raw = pop(key(t, s, m), db=db)
            if raw is None:
                out.append(None)
                continue
            _, _, deadline_ns, attempts, publish_ns = FLIGHT.unpack(raw)
            if deadline_ns:
                delete(DTSM.pack(deadline_ns, t, s, m), db=self._deadlines)
            out.append((attempts, publish_ns))
        return out

    def get_inflight(self, t: int, s: int, m: int) -> Flight | None:
        raw = self.txn.get(TSM.pack(t, s, m), db=self._inflight)
        return None if raw is None else Flight._make(FLIGHT.unpack(raw))

    def pop_inflight(self, t: int, s: int, m: int) -> Flight | None:
        raw = self.txn.pop(TSM.pack(t, s, m), db=self._inflight)
        if raw is None:
            return None
        flight = Flight._make(FLIGHT.unpack(raw))
        if flight.deadline_ns:
            self.txn.delete(DTSM.pack(flight.deadline_ns, t, s, m), db=self._deadlines)
        return flight

    def due_deadlines(self, now_ns: int, limit: int) -> list[tuple[int, int, int]]:
        """Up to `limit` in-flight (t, s, m) whose AckRetry deadline is <= now_ns."""
        out = []
        with self.txn.cursor(db=self._deadlines) as cur:
            if cur.first():
                for key in cur.iternext(values=False):
                    deadline, t, s, m = DTSM.unpack(key)
                    if deadline > now_ns or len(out) >= limit:
                        break
                    out.append((t, s, m))
        return out

    def next_deadline_ns(self) -> int | None:
        with self.txn.cursor(db=self._deadlines) as cur:
            return DTSM.unpack(cur.key())[0] if cur.first() else None

    def inflight_of(self, t: int, s: int) -> list[tuple[int, Flight]]:
        """Everything in flight to s on t (at most its Window, so a short list)."""
        prefix = TS.pack(t, s)
        out = []
        with self.txn.cursor(db=self._inflight) as cur:
            if cur.set_range(prefix):
                for key, raw in cur:
                    if key[:6] != prefix:
                        break
                    out.append((TSM.unpack(key)[2], Flight._make(FLIGHT.unpack(raw))))
        return out

    # --- expiry index ---------------------------------------------------------------
    def add_expiry(self, expires_ns: int, t: int, m: int) -> None:
        self.txn.put(ETM.pack(expires_ns, t, m), b"", db=self._expiry)

    def remove_expiry(self, expires_ns: int, t: int, m: int) -> None:
        self.txn.delete(ETM.pack(expires_ns, t, m), db=self._expiry)

    def due_expiries(self, now_ns: int, limit: int) -> list[tuple[int, int, int]]:
        """(expires_ns, t, m) with expires_ns <= now_ns, oldest first, among the first
        `limit` due entries. Those of a staged publish count toward the limit but are
        left out: they wait (a delivery still checks expiry) rather than let one
        sweep read a whole staged publish."""
        out = []
        staged = self.staged()
        seen = 0
        with self.txn.cursor(db=self._expiry) as cur:
            if cur.first():
                for key in cur.iternext(values=False):
                    entry = ETM.unpack(key)
                    if entry[0] > now_ns or seen >= limit:
                        break
                    seen += 1
                    if staged is None or not staged.hides(entry[1], entry[2]):
                        out.append(entry)
        return out

    def next_expiry_ns(self) -> int | None:
        with self.txn.cursor(db=self._expiry) as cur:
            return ETM.unpack(cur.key())[0] if cur.first() else None

    # --- dedupe index -----------------------------------------------------------------
    def get_dedupe(self, t: int, key: bytes) -> int | None:
        raw = self.txn.get(u32(t) + key, db=self._dedupe)
        return U64.unpack(raw)[0] if raw is not None else None

    def put_dedupe(self, t: int, key: bytes, m: int) -> None:
        self.txn.put(u32(t) + key, U64.pack(m), db=self._dedupe)

    def delete_dedupe(self, t: int, key: bytes) -> None:
        self.txn.delete(u32(t) + key, db=self._dedupe)
