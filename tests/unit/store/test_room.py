"""Whether the store has room for a publish (store/room.py): the pages in use are
counted now and then, not at every publish, yet a publish is refused exactly
when a count says the store has reached MaxStoreBytes."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from ppmq.store.room import BODY_FACTOR, BODY_OVERHEAD, RECOUNT_BYTES
from ppmq.store.schema import Body, encode_body
from ppmq.store.state import NS
from ppmq.store.store import Store, Txn

T = 1  # a topic id
MAX = 4 << 20  # MaxStoreBytes of these stores
NOW = 1_800_000_000 * NS


def body(size: int) -> Body:
    return Body(0, NOW, 0, b"", b"x" * size)


@pytest.fixture
def store(tmp_path) -> Iterator[Store]:
    store = Store(str(tmp_path / "data"), sync=False, max_bytes=MAX)
    yield store
    store.close()


def fill(txn: Txn, size: int) -> int:
    """Bodies of `size` bytes until a publish would be refused; how many."""
    m = 0
    while not txn.full():
        txn.put_records(T, m, [encode_body(body(size))])
        m += 1
    return m


def test_a_store_far_from_full_is_counted_once_a_recount_of_bodies(store: Store) -> None:
    n, size = 1_000, 1_000  # 2 MB in all, half of MAX
    with store.write() as txn:
        for m in range(n):
            assert not txn.full()
            txn.put_records(T, m, [encode_body(body(size))])
        txn.put_records(T, n, [encode_body(body(size))] * n)
        assert not txn.full()
    most = 2 * n * (BODY_FACTOR * size + BODY_OVERHEAD) // RECOUNT_BYTES + 2
    assert 2 <= store.room.counts <= most, "counted at every publish, or never again"


def test_a_publish_is_refused_when_and_only_when_the_pages_in_use_reach_the_limit(store: Store) -> None:
    rng = random.Random(7)
    with store.write() as txn:
        for m in range(10_000):
            refused = txn.full()
            used = txn.used_bytes()
            assert refused == (used >= MAX), f"after {m} bodies, {used} bytes in use"
            if refused:
                break
            # sizes on both sides of half a page, where bodies move to overflow pages
            txn.put_records(T, m, [encode_body(body(rng.choice((rng.randrange(10, 2_000), rng.randrange(2_000, 30_000)))))])
        assert refused, "never full"
        counts = store.room.counts
    assert counts < m / 2, "counted at every publish"


def test_a_count_taken_in_writes_that_were_undone_is_not_trusted(store: Store) -> None:
    with store.write() as txn:
        ms = fill(txn, 20_000)
    with pytest.raises(RuntimeError), store.write() as txn:
        txn.delete_messages(T, list(range(ms)), dedupe=False)
        assert not txn.full()
        raise RuntimeError("undo")
    with store.write() as txn:
        assert txn.full(), "the count of a transaction that was undone"
