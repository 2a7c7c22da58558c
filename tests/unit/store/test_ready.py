"""A subscription's ready queue as runs (store/ready.py): entries go in and out
at their places, and the runs keep store/schema.py's invariant whatever the order."""

from __future__ import annotations

from pathlib import Path

import lmdb

from ppmq.store import migrate
from ppmq.store.schema import READY_ENTRY, READY_RUN, TAKEN_ATTEMPTS, TSPQ, Body, ReadyEntry, Staged
from ppmq.store.store import Txn

T, S = 1, 1
R = READY_RUN


def runs(txn: Txn) -> list[tuple[int, int, list[int]]]:
    """(prio, key pos, entries' places) of every run, in key order."""
    out = []
    for key, value in txn.txn.cursor(db=txn.store.dbs["ready"]):
        _, _, prio, first = TSPQ.unpack(key)
        out.append((prio, first, [pos for pos, _, _ in READY_ENTRY.iter_unpack(value)]))
    return out


def assert_invariant(txn: Txn) -> None:
    """store/schema.py: entries ascend from their run's key on and stay below the next run's key."""
    found = runs(txn)
    for i, (prio, first, places) in enumerate(found):
        assert places and first <= places[0] and places == sorted(set(places))
        assert len(places) <= 2 * R
        if i + 1 < len(found) and found[i + 1][0] == prio:
            assert places[-1] < found[i + 1][1]


def stored(txn: Txn, places: range | list[int], prio: int = 0) -> list[tuple[int, int, int]]:
    """Messages at `places` (each its own id), stored, as push_ready_many takes them."""
    for m in places:
        txn.put_body(T, m, Body(prio, 1, 0, b"%d" % m, b'{"Payload":%d}' % m))
    return [(prio, m, m) for m in places]


def test_a_publish_appends_runs_of_ready_run_entries_and_a_take_crosses_them(txn):
    # Given 2.5 runs' worth of entries published at once
    txn.push_ready_many(T, S, stored(txn, range(1, 2 * R + R // 2 + 1)))
    assert [(first, len(places)) for _, first, places in runs(txn)] == [(1, R), (R + 1, R), (2 * R + 1, R // 2)]
    # When a batch takes a run and a half
    taken, expired, missing = txn.take_ready(T, S, R + R // 2, 0, 0)
    # Then it took them in order, deleted the first run and cut the second, which keeps its key
    assert [m for m, *_ in taken] == list(range(1, R + R // 2 + 1)) and not expired and not missing
    assert [(first, places[0], len(places)) for _, first, places in runs(txn)] == [
        (R + 1, R + R // 2 + 1, R // 2),
        (2 * R + 1, 2 * R + 1, R // 2),
    ]
    assert_invariant(txn)


def test_small_publishes_fill_the_last_run_before_starting_another(txn):
    for m in range(1, R + 3):
        txn.push_ready_many(T, S, stored(txn, [m]))
    assert [(first, len(places)) for _, first, places in runs(txn)] == [(1, R), (R + 1, 2)]


def test_an_entry_back_at_its_place_joins_the_run_that_holds_it(txn):
    # Given a run of even places from 10 on
    txn.push_ready_many(T, S, stored(txn, range(10, 30, 2)))
    # When entries come back into the middle of it, and before it
    txn.push_ready(T, S, 0, 15, 15, 2)
    txn.push_ready(T, S, 0, 5, 5, 1)
    # Then the middle one is in its run, in order, with its attempts; the one before starts a run of its own
    assert runs(txn) == [(0, 5, [5]), (0, 10, [10, 12, 14, 15] + list(range(16, 30, 2)))]
    assert txn.ready_attempts(T, S, 0, 15) == 2 and txn.ready_attempts(T, S, 0, 13) is None
    assert_invariant(txn)


def test_an_entry_restarted_in_place_keeps_its_run_and_neighbours_and_starts_its_attempts_anew(txn):
    # Given a run with an entry delivered twice before, amid first attempts
    txn.push_ready_many(T, S, stored(txn, range(10, 30, 2)))
    txn.push_ready(T, S, 0, 15, 15, 2)
    before = runs(txn)
    # When a new version restarts it, and one never delivered, and a place with no entry
    assert txn.restart_ready(T, S, 0, 15) and txn.restart_ready(T, S, 0, 12)
    assert not txn.restart_ready(T, S, 0, 13) and not txn.restart_ready(T, S, 1, 15)
    # Then each is where it was, with no attempts; nothing else moved
    assert runs(txn) == before
    assert [txn.ready_attempts(T, S, 0, pos) for pos in (12, 14, 15, 16)] == [0, 0, 0, 0]
    assert_invariant(txn)


def test_entries_pushed_together_each_join_the_run_that_holds_their_place(txn):
    # Given two full runs, of odd places from 1 and from 1001
    odd = list(range(1, 2 * R, 2))
    txn.push_ready_many(T, S, stored(txn, odd))
    txn.push_ready_many(T, S, stored(txn, [1000 + pos for pos in odd]))
    # When entries of places before, inside, between and after them are pushed in one call
    txn.push_ready_many(T, S, stored(txn, [0, 2, 500, 1002, 5000]))
    # Then the one before the first run starts its own, and each other joins the run holding its place
    assert runs(txn) == [(0, 0, [0]), (0, 1, sorted(odd + [2, 500])), (0, 1001, sorted([1000 + pos for pos in odd] + [1002, 5000]))]
    assert_invariant(txn)


def test_a_run_that_grows_past_twice_its_size_splits(txn):
    # Given a full run of even places
    txn.push_ready_many(T, S, stored(txn, range(2, 2 * R + 2, 2)))
    # When the odd places come back one by one, and a run grows past 2 x READY_RUN
    for pos in range(3, 2 * R + 2, 2):
        txn.push_ready(T, S, 0, pos, pos, 1)
    txn.push_ready(T, S, 0, 1, 1, 1)
    txn.push_ready_many(T, S, [(0, 2 * R + 2, 2 * R + 2)])
    # Then no run is longer than that, all are in order, and every entry is read back in place
    assert_invariant(txn)
    assert len(runs(txn)) > 1
    assert [e.pos for e in txn.ready_of(T, S)] == list(range(1, 2 * R + 3))


def test_removing_entries_rewrites_their_run_and_an_emptied_run_goes(txn):
    txn.push_ready_many(T, S, stored(txn, range(1, 6)))
    # From the middle: its attempts come back, the run keeps the others
    assert txn.pop_ready(T, S, 0, 3) == 0 and txn.pop_ready(T, S, 0, 3) is None
    # The first: the run keeps its key
    assert txn.remove_ready(T, S, 0, 1)
    assert runs(txn) == [(0, 1, [2, 4, 5])]
    assert_invariant(txn)
    for pos in (2, 4, 5):
        assert txn.remove_ready(T, S, 0, pos)
    assert runs(txn) == [] and txn.first_ready(T, S, 0) is None


def test_a_staged_publish_is_hidden_entry_by_entry_inside_runs_and_jumped_over_between(txn):
    # Given places 1-10, a staged publish of 11 to 3R, and 5 more published after it, which join its last run
    last = 3 * R
    txn.push_ready_many(T, S, stored(txn, range(1, 11)))
    txn.put_staged(Staged(T, 11, last))
    txn.push_ready_many(T, S, stored(txn, range(11, last + 1)))
    txn.push_ready_many(T, S, stored(txn, range(last + 1, last + 6)))
    # Then readers see only the visible entries, and a take takes only those
    visible = list(range(1, 11)) + list(range(last + 1, last + 6))
    assert [e.pos for e in txn.ready_of(T, S)] == visible
    assert txn.first_ready(T, S, 0) == ReadyEntry(0, 1, 1, 0)
    taken, _, _ = txn.take_ready(T, S, 100, 0, 0)
    assert [m for m, *_ in taken] == visible
    # and the staged entries are all still there, in their runs
    assert [pos for _, _, places in runs(txn) for pos in places] == list(range(11, last + 1))
    assert txn.first_ready(T, S, 0) is None
    assert_invariant(txn)


def test_a_batch_takes_priorities_in_order_each_by_place(txn):
    txn.push_ready_many(T, S, stored(txn, range(1, 20, 2), prio=1) + stored(txn, range(2, 20, 2), prio=0))
    txn.push_ready(T, S, 1, 0, 0, 1)  # an entry back at an early place of priority 1
    txn.put_body(T, 0, Body(1, 1, 0, b"0", b"{}"))
    taken, _, _ = txn.take_ready(T, S, 15, 0, 0)
    assert [(prio, pos) for _, prio, pos, *_ in taken] == [(0, pos) for pos in range(2, 20, 2)] + [(1, pos) for pos in (0, 1, 3, 5, 7, 9)]
    assert TAKEN_ATTEMPTS(taken[9]) == 2 and TAKEN_ATTEMPTS(taken[0]) == 1


def test_a_take_leaves_expired_entries_in_place_and_drops_those_whose_message_is_gone(txn):
    txn.push_ready_many(T, S, stored(txn, range(1, 6)))
    txn.put_body(T, 2, Body(0, 1, 50, b"2", b"{}"))  # expires at 50
    txn.delete_messages(T, [4], dedupe=False)
    taken, expired, missing = txn.take_ready(T, S, 2, 0, 100)
    assert ([m for m, *_ in taken], expired, missing) == ([1, 3], [2], [])
    taken, expired, missing = txn.take_ready(T, S, 2, 0, 100)
    assert ([m for m, *_ in taken], expired, missing) == ([5], [2], [0])
    assert runs(txn) == [(0, 1, [2])]


def old_ready_rows(path: Path, entries: list[tuple[int, int, int, int]]) -> lmdb.Environment:
    """A ready database in the schema 3 layout: a row per (t, s, prio, pos), -> pos as M, attempts 0."""
    env = lmdb.open(str(path), max_dbs=2)
    db = env.open_db(b"ready")
    with env.begin(write=True) as txn:
        for t, s, prio, pos in entries:
            txn.put(TSPQ.pack(t, s, prio, pos), migrate._READY_3.pack(pos, 0), db=db)
    return env


def test_the_migration_makes_runs_of_each_queue_a_chunk_at_a_time(tmp_path, monkeypatch):
    # Given schema 3 ready rows of two subscribers and two priorities, converted a few rows a transaction
    monkeypatch.setattr(migrate, "_READY_CHUNK", 7)
    entries = [(1, s, prio, pos) for s in (1, 2) for prio in (0, 1) for pos in range(prio + 1, 2 * R + 10, 2)]
    env = old_ready_rows(tmp_path, entries)
    db = env.open_db(b"ready")
    start, rewritten = b"", 0
    while start is not None:
        with env.begin(write=True) as txn:
            done, start = migrate._ready_as_runs(txn, {"ready": db}, start)
        rewritten += done
    assert rewritten == len(entries)
    # Then every entry is in a run keyed by its first place, in order, each queue's runs apart
    with env.begin() as txn:
        rows = [(TSPQ.unpack(key), list(READY_ENTRY.iter_unpack(value))) for key, value in txn.cursor(db=db)]
    assert [(t, s, prio, pos) for (t, s, prio, _), run in rows for pos, _, _ in run] == entries
    assert all(key[3] == run[0][0] and len(run) <= R for key, run in rows)
    env.close()
