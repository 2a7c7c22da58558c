"""The soonest time of each timer database, kept in memory (store/timers.py):
after any mix of puts and deletes, across steps and through undone writes, it
is what the databases' first keys say."""

from __future__ import annotations

import random

import pytest

from ppmq.store.schema import FLIGHT_ENTRY, Delayed
from ppmq.store.store import Store, Txn
from ppmq.store.timers import first_time

T, S = 1, 1  # a topic id, a subscriber id


def read(txn: Txn) -> int | None:
    """The soonest timer, from the databases' first keys."""
    dbs = txn.store.dbs
    soonest = min(first_time(txn.txn, dbs[name]) for name in ("expiry", "copy_expiry", "deadlines", "due"))
    return None if soonest == 1 << 64 else soonest


class Undone(Exception):
    pass


def change(txn: Txn, rng: random.Random, held: dict[str, list]) -> None:
    """One put or delete of a timer entry, of a kind and time chosen by rng."""
    kind, at = rng.choice(["expiry", "copy", "flight", "delayed"]), rng.choice([10, 20, 30, 40])
    m = rng.randrange(1, 6)
    if kind == "expiry":
        if held["expiry"] and rng.random() < 0.5:
            txn.remove_expiry(*held["expiry"].pop(rng.randrange(len(held["expiry"]))))
        else:
            txn.add_expiry(at, T, m)
            held["expiry"].append((at, T, m))
    elif kind == "copy":
        if rng.random() < 0.5:
            txn.drop_copy_expiries(T, [m], S)
        else:
            txn.put_copy_expiry(T, m, S, at, expire=True)
    elif kind == "flight":
        if held["flight"] and rng.random() < 0.5:
            txn.ack_flights(T, S, [held["flight"].pop(rng.randrange(len(held["flight"])))])
        elif m not in held["flight"]:
            txn.put_flight(T, S, [FLIGHT_ENTRY.pack(m, 0, m, 1, 1)], at, [m])
            held["flight"].append(m)
    elif held["delayed"] and rng.random() < 0.5:
        txn.pop_delayed(T, S, 0, held["delayed"].pop(rng.randrange(len(held["delayed"]))))
    elif m not in held["delayed"]:
        txn.push_delayed(T, S, Delayed(0, m, m, 0, at))
        held["delayed"].append(m)


@pytest.mark.parametrize("seed", range(8))
def test_the_next_timer_is_what_the_rows_say_through_steps_and_undone_writes(tmp_path, seed: int) -> None:
    rng = random.Random(seed)
    store = Store(str(tmp_path / "data"), sync=False, max_bytes=1 << 28)
    held: dict[str, list] = {"expiry": [], "flight": [], "delayed": []}
    try:
        for _ in range(40):
            kept = {kind: list(items) for kind, items in held.items()}
            undo = rng.random() < 0.2
            try:
                with store.write() as txn:
                    for _ in range(rng.randrange(1, 6)):
                        change(txn, rng, held)
                        assert txn.next_timer_ns() == read(txn)
                    if undo:
                        raise Undone
            except Undone:
                held = kept
            with store.write() as txn:
                assert txn.next_timer_ns() == read(txn)
    finally:
        store.close()
