"""Fixtures of the unit tests that work on the store's rows directly."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ppmq.store.store import Store, Txn


@contextmanager
def writing(path: str | Path) -> Iterator[Txn]:
    """One write transaction on the store at path (new or not), committed at the
    end of the block, and the store closed."""
    store = Store(str(path), sync=False, max_bytes=1 << 28)
    try:
        with store.write() as txn:
            yield txn
    finally:
        store.close()


@pytest.fixture
def txn(tmp_path) -> Iterator[Txn]:
    """One write transaction on a new store, committed when the test ends."""
    with writing(tmp_path / "data") as txn:
        yield txn
