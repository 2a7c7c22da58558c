"""Fixtures of the unit tests that work on the store's rows directly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ppmq.store import Store, Txn


@pytest.fixture
def txn(tmp_path) -> Iterator[Txn]:
    """One write transaction on a new store, committed when the test ends."""
    store = Store(str(tmp_path / "data"), sync=False, max_bytes=1 << 28)
    try:
        with store.write() as txn:
            yield txn
    finally:
        store.close()
