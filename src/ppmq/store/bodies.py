"""The messages themselves: the bodies database, a row per group of the messages
of one publish (store/schema.py).

With a row per message, fan-out wrote and deleted a row for every message, and
a batch taken from the store read one per message and subscriber. Here a
publish writes a row per GROUP_MESSAGES of its messages (fewer where they pass
BODY_ROW_BYTES), the last ack of a group deletes one row, and a batch reads each
row its messages are in once. Rows tile a topic's ids as holders rows do: the
row of message m is the one with the largest key at or below m. A row holds
only stored messages: one that is deleted is cut out of it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate, repeat
from struct import Struct

import lmdb
import msgspec

from ppmq.store.meta import Meta
from ppmq.store.room import Room
from ppmq.store.rows import at_row, change_rows
from ppmq.store.schema import (
    BODY_COLUMNS,
    BODY_HEAD,
    BODY_ROW_BYTES,
    BODY_ROW_HEAD,
    GROUP_MESSAGES,
    TM,
    Body,
    Staged,
    body_columns,
    body_row_spans,
    decode_body,
    encode_body,
    encode_body_row,
    record_span,
    replace_body_record,
    u32,
)

Found = tuple[bytes, int, int]  # a row, and where one message's record begins and ends in it
# The head of a row of one message: n, its id and where its record ends, then
# the record's head (BODY_HEAD); ONE bytes, after which come its key and its JSON.
ONE_RECORD = Struct(">HQI" + BODY_HEAD.format.lstrip(">"))
ONE = ONE_RECORD.size


class Popped(msgspec.Struct):
    """What left the bodies rows (Bodies.pop). A Struct: made at every last
    ack, with no Python call (each instance gets lists of its own)."""

    count: int = 0
    size: int = 0  # bytes of delivered JSON
    expiries: list[tuple[int, int]] = []  # (expires_ns, m) of those that expire
    keys: list[bytes] = []  # their dedupe keys, when asked for


class Bodies:
    """The bodies database of one transaction."""

    __slots__ = ("txn", "db", "meta", "room")

    def __init__(self, txn: lmdb.Transaction[bytes], db: lmdb._Database, meta: Meta, room: Room) -> None:
        self.txn = txn
        self.db = db
        self.meta = meta  # the staging record: a publish being staged is hidden from walks
        self.room = room  # what a write may have grown the store by (store/room.py)

    def get(self, t: int, m: int) -> Body | None:
        found = self._at(t, m)
        return None if found is None else decode_body(found[0][found[1] : found[2]])

    def publish_ns(self, t: int, m: int) -> int:
        """When m was published (0 if it is gone); decodes the header only."""
        found = self._at(t, m)
        return 0 if found is None else BODY_HEAD.unpack_from(found[0], found[1])[1]

    def _at(self, t: int, m: int) -> Found | None:
        with self.txn.cursor(db=self.db) as cur:
            return BodyFinder(cur, t).find(m)

    def cursor(self) -> lmdb.Cursor[bytes]:
        """A cursor of the rows, for a BodyFinder (a batch's walk finds many messages)."""
        return self.txn.cursor(db=self.db)

    def put(self, t: int, m: int, body: Body) -> Body | None:
        """m's body; returns the version it replaced, if any. A new version
        takes the old one's place in its row, spliced in (a Dedupe topic's
        replacement: the rest of the row is copied, not taken apart); a new
        message joins the row whose range it is in (or starts one below them)."""
        record = encode_body(body)
        with self.txn.cursor(db=self.db) as cur:
            key, raw = cur.item() if at_row(cur, t, m) else (TM.pack(t, m), None)
        if raw is None:
            self._write_row(key, [m], [record])
            return None
        ids, ends, base = body_columns(raw)
        i = bisect_left(ids, m)
        if i < len(ids) and ids[i] == m:
            start, end = record_span(ends, base, i)
            old = decode_body(raw[start:end])
            row = replace_body_record(raw, ends, base, i, record)
            if not _oversized(len(ids), len(row) - base):
                self._put_row(key, row, len(ids))
                return old
        else:
            old = None
        all_ids, records = _split(raw)
        all_ids[i : i + (old is not None)] = [m]
        records[i : i + (old is not None)] = [record]
        self._write_row(key, all_ids, records)
        return old

    def _write_row(self, key: bytes, ids: list[int], records: list[bytes]) -> None:
        """Put a row; one that an insert took past GROUP_MESSAGES, or past twice
        BODY_ROW_BYTES, is split in two, its upper half keyed by its first id."""
        if _oversized(len(ids), sum(map(len, records))):
            half = len(ids) // 2
            self._write_row(key[:4] + ids[half].to_bytes(8, "big"), ids[half:], records[half:])
            ids, records = ids[:half], records[:half]
        self._put_row(key, encode_body_row(ids, records), len(ids))

    def _put_row(self, key: bytes, row: bytes, n: int) -> None:
        """A row of n messages, counted toward the store's growth."""
        self.room.wrote(len(row), n)
        self.txn.put(key, row, db=self.db)

    def put_records(self, t: int, first: int, records: list[bytes]) -> None:
        """New messages, the records (schema.body_records) of ids first, first + 1,
        ...: ids new from the topic's sequence, so above every stored one (a
        publish). They start rows of their own, GROUP_MESSAGES a row at most,
        each put in key order (store/rows.py); a message put anywhere else
        is put's. A publish of one (as at a paced rate) is a row of one,
        whatever its size, with no columns to compute."""
        n = len(records)
        if not n:
            return
        if n == 1:  # a row of one, with no columns to compute
            size = len(records[0])
            rows = [(TM.pack(t, first), BODY_ROW_HEAD[1].pack(1, first, size) + records[0])]
        else:
            ends = [*accumulate(map(len, records))]  # where each record ends, in a row of them all
            size = ends[-1]
            if n <= GROUP_MESSAGES and size < BODY_ROW_BYTES:  # most publishes: one row, cut nowhere
                # encode_body_row's, with the ends at hand: a row at every publish
                rows = [(TM.pack(t, first), BODY_ROW_HEAD[n].pack(n, *range(first, first + n), *ends) + b"".join(records))]
            else:
                spans = body_row_spans(list(map(len, records)))
                rows = [(TM.pack(t, first + a), encode_body_row(range(first + a, first + b), records[a:b])) for a, b in spans]
        self.room.wrote(size, n)
        put, db = self.txn.put, self.db
        for key, row in rows:  # by position (dupdata, overwrite, append, db): py-lmdb parses those for less than keywords
            if not put(key, row, True, True, True, db):
                put(key, row, True, True, False, db)

    def pop(self, t: int, ms: list[int], *, keys: bool) -> Popped:
        """Cut each of ms out of its row (a row left empty is deleted). Returns
        how many were stored, the bytes of their delivered JSON, their
        (expires_ns, m) where they expire, and their dedupe keys if `keys`:
        what the counters and the indexes need (store/messages.py). The path of every
        last ack: each row is read and written once, and each header read
        where it lies, with no object made per message. One message in a row
        of its own, as every message of a publish of one is, goes with its
        row, read by its head alone rather than by the rows' general change."""
        if len(ms) == 1:
            key, db = TM.pack(t, ms[0]), self.db
            raw = self.txn.get(key, None, db)
            if raw is not None:
                n, m, _, _, _, expires_ns, klen = ONE_RECORD.unpack_from(raw)
            if raw is not None and n == 1 and m == ms[0]:
                self.txn.delete(key, b"", db)
                return Popped(
                    1,
                    len(raw) - ONE - klen,
                    [(expires_ns, m)] if expires_ns else [],
                    [raw[ONE : ONE + klen]] if keys else [],
                )
            popped = Popped()
            change_rows(self.txn, db, t, ms, _cut, (popped, keys), (key, raw))
            return popped
        popped = Popped()
        change_rows(self.txn, self.db, t, sorted(set(ms)), _cut, (popped, keys))
        return popped

    def of(self, t: int) -> Iterator[tuple[int, Body]]:
        """Every stored message of topic t, by id; none of a publish being staged."""
        staged = self.meta.staged()
        for m, raw, start, end in self._records_from(t, 0):
            if staged is None or not staged.hides(t, m):
                yield m, decode_body(raw[start:end])

    def staged_ids(self, staged: Staged, limit: int) -> list[int]:
        """Up to `limit` ids of stored messages in the staged range, lowest first."""
        out: list[int] = []
        for m, *_ in self._records_from(staged.t, staged.first):
            if m > staged.last or len(out) >= limit:
                break
            out.append(m)
        return out

    def _records_from(self, t: int, first: int) -> Iterator[tuple[int, bytes, int, int]]:
        """Each stored message of t from id `first` on, by id: (m, row, start, end)."""
        prefix = u32(t)
        with self.txn.cursor(db=self.db) as cur:
            if not at_row(cur, t, first) and not cur.set_range(TM.pack(t, first)):
                return
            while cur.key()[:4] == prefix:
                raw = cur.value()
                ids, ends, base = body_columns(raw)
                start = base
                for m, end in zip(ids, ends):
                    if m >= first:
                        yield m, raw, start, base + end
                    start = base + end
                if not cur.next():
                    return


class BodyFinder:
    """Finds messages' records in the rows of one topic, for a walk that asks
    for many (a batch taken from the store): a row is read once for all the
    messages it holds that come one after another."""

    __slots__ = ("_cur", "_t", "_raw", "_ids", "_ends", "_base")

    _ids: tuple[int, ...]  # the ids of the row read last, and where each one's record ends
    _ends: tuple[int, ...]

    def __init__(self, cur: lmdb.Cursor[bytes], t: int) -> None:
        self._cur, self._t = cur, t
        self._raw, self._ids, self._ends, self._base = b"", (), (), 0

    def find(self, m: int) -> Found | None:
        """m's row, and where its record begins and ends in it; None if m is not stored."""
        ids = self._ids
        i = bisect_left(ids, m)
        if i == len(ids) or ids[i] != m:
            if not at_row(self._cur, self._t, m):
                return None
            self._raw = self._cur.value()
            self._ids, self._ends, self._base = ids, _, _ = body_columns(self._raw)
            i = bisect_left(ids, m)
            if i == len(ids) or ids[i] != m:
                return None
        return self._raw, *record_span(self._ends, self._base, i)


def _oversized(n: int, size: int) -> bool:
    """A row of n messages whose records take `size` bytes is split in two:
    past GROUP_MESSAGES, or past twice BODY_ROW_BYTES (unless it holds one)."""
    return n > GROUP_MESSAGES or (n > 1 and size > 2 * BODY_ROW_BYTES)


def _split(raw: bytes) -> tuple[list[int], list[bytes]]:
    """A row's ids and records, as lists to change."""
    ids, ends, base = body_columns(raw)
    starts = (0, *ends[:-1])
    return list(ids), [raw[base + a : base + b] for a, b in zip(starts, ends)]


def _cut(given: tuple[Popped, bool], raw: bytes, wanted: list[int]) -> tuple[bytes, list[int]]:
    """`raw` without the records of `wanted`; given (popped, keys), their
    counts, sizes, expiries and, if `keys`, keys are added to `popped`. b""
    when nothing is left. A row wholly wanted, what the last ack of a whole
    publish is, has its heads read by columns, with no step per message in Python."""
    n = raw[0] << 8 | raw[1]  # body_columns', without a call of its own: every last ack comes here
    columns = BODY_COLUMNS[n].unpack_from(raw, 2)
    ids, ends, base = columns[:n], columns[n:], 2 + 12 * n
    popped, keys = given
    head, head_size = BODY_HEAD.unpack_from, BODY_HEAD.size
    # ids the row does not hold are none of its business; sets only when wanted is not the row's ids themselves
    if ids == (*wanted,) or set(wanted).issuperset(ids):
        starts = (base, *map(base.__add__, ends[:-1]))
        _, _, expiries, klens = zip(*map(head, repeat(raw), starts))
        popped.count += n
        popped.size += ends[-1] - head_size * n - sum(klens)
        if expiries != (0,) * n:  # some expire
            popped.expiries += [(expires_ns, m) for expires_ns, m in zip(expiries, ids) if expires_ns]
        if keys:
            popped.keys += [raw[start + head_size : start + head_size + klen] for start, klen in zip(starts, klens)]
        return b"", []
    want, kept_ids, kept = set(wanted), [], []
    count = size = 0
    start = base
    for m, end in zip(ids, ends):
        end += base
        if m in want:
            _, _, expires_ns, klen = head(raw, start)
            count += 1
            size += end - start - head_size - klen
            if expires_ns:
                popped.expiries.append((expires_ns, m))
            if keys:
                popped.keys.append(raw[start + head_size : start + head_size + klen])
        else:
            kept_ids.append(m)
            kept.append(raw[start:end])
        start = end
    popped.count += count
    popped.size += size
    return (encode_body_row(kept_ids, kept) if kept_ids else b""), []
