"""Batches in flight (store/flights.py): an ack takes messages out of their batch
rows, and a batch acked whole goes without its entries being read."""

from __future__ import annotations

import random
from pathlib import Path

from ppmq.store.schema import FLIGHT_ENTRY
from ppmq.store.store import Txn
from tests.unit.conftest import writing

T, S = 1, 1  # a topic id, a subscriber id
DEADLINE_NS = 5_000


def push(txn: Txn, ms: list[int], deadline_ns: int = DEADLINE_NS) -> None:
    txn.put_flight(T, S, [FLIGHT_ENTRY.pack(m, 0, m, 1, 1_000) for m in ms], deadline_ns, ms)


def in_flight(txn: Txn) -> list[int]:
    return [f.m for f in txn.inflight_of(T, S)]


def test_a_batch_acked_whole_in_any_order_goes_with_its_deadline(txn: Txn) -> None:
    push(txn, [1, 2, 3])
    assert txn.ack_flights(T, S, [3, 1, 2]) == [3, 1, 2]
    assert in_flight(txn) == []
    assert txn.next_deadline_ns() is None


def test_part_of_a_batch_leaves_the_rest_in_flight_with_its_deadline(txn: Txn) -> None:
    push(txn, [1, 2, 3])
    assert txn.ack_flights(T, S, [2]) == [2]
    assert in_flight(txn) == [1, 3]
    assert txn.next_deadline_ns() == DEADLINE_NS


def test_a_repeated_or_unknown_key_is_acked_once_or_not_at_all(txn: Txn) -> None:
    push(txn, [1, 2])
    # [1, 1] names two keys, as many as the batch holds, but only one message
    assert txn.ack_flights(T, S, [1, 1, 9]) == [1]
    assert in_flight(txn) == [2]
    assert txn.ack_flights(T, S, [2, 1]) == [2]
    assert in_flight(txn) == []


def test_an_ack_over_two_batches_takes_from_both(txn: Txn) -> None:
    push(txn, [1, 2])
    push(txn, [3, 4], deadline_ns=0)
    assert txn.ack_flights(T, S, [4, 1, 2]) == [4, 1, 2]
    assert in_flight(txn) == [3]


def test_acks_take_what_was_in_flight_as_a_set_of_ids_would(tmp_path: Path) -> None:
    rng = random.Random(7)
    for round_ in range(30):
        model: set[int] = set()
        with writing(tmp_path / str(round_)) as txn:
            next_m = 1
            for _ in range(20):
                if rng.random() < 0.5:
                    ms = list(range(next_m, next_m + rng.randint(1, 6)))
                    next_m += len(ms)
                    push(txn, ms)
                    model.update(ms)
                else:
                    ack = rng.choices(range(1, next_m + 2), k=rng.randint(0, 5)) + rng.sample(
                        sorted(model), k=min(len(model), rng.randint(0, 6))
                    )
                    expected = list(dict.fromkeys(m for m in ack if m in model))
                    assert txn.ack_flights(T, S, ack) == expected
                    model.difference_update(ack)
                assert in_flight(txn) == sorted(model)
