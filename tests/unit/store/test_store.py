"""A write transaction on the store (`with store.write() as txn`): committed when
its block ends cleanly; otherwise undone whole, with what memory keeps of the
rows, and LMDB's errors leave as the store's own, which callers turn into 507."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ppmq.errors import StoreFullError
from ppmq.store.schema import FLIGHT_ENTRY, Taken
from ppmq.store.store import Store

T, S = 1, 1  # a topic id, a subscriber id
# a message's first delivery, as a publish makes it and a ready tail keeps it
FRESH: Taken = (1, 0, 1, 1, 1_000, b'{"Key":"1"}', FLIGHT_ENTRY.pack(1, 0, 1, 1, 1_000), 0)


@pytest.fixture
def store(tmp_path) -> Iterator[Store]:
    store = Store(str(tmp_path / "data"), sync=False, max_bytes=1 << 20)
    yield store
    store.close()


def test_a_block_that_ends_cleanly_is_committed(store: Store) -> None:
    with store.write() as txn:
        txn.put_meta(b"test", b"kept")
    assert store.committed_meta(b"test") == b"kept"


def test_a_block_that_raises_is_undone_with_what_memory_keeps_and_its_exception_goes_on(store: Store) -> None:
    store.ready_tails.start(T, S, [FRESH])
    with pytest.raises(ValueError, match="a bug"), store.write() as txn:
        txn.put_meta(b"test", b"undone")
        raise ValueError("a bug")
    assert store.committed_meta(b"test") is None
    assert store.ready_tails.take(T, S, 10, 0) is None, "a tail kept past undone writes"


def test_lmdb_running_out_of_map_leaves_as_store_full_and_the_store_goes_on(store: Store) -> None:
    # Given a store whose map (MaxStoreBytes and its headroom) is far smaller than a block's writes
    with pytest.raises(StoreFullError, match="LMDB map is full"), store.write() as txn:
        txn.put_meta(b"test", b"undone")
        for i in range(100):
            txn.put_meta(b"big%d" % i, b"x" * (1 << 20))
    # Then nothing of the block stays, and the next transaction commits
    assert store.committed_meta(b"test") is None and store.committed_meta(b"big0") is None
    with store.write() as txn:
        txn.put_meta(b"test", b"kept")
    assert store.committed_meta(b"test") == b"kept"
