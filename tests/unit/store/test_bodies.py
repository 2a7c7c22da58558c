"""The bodies rows (store/bodies.py): the messages of a publish share a row, up to
GROUP_MESSAGES of them or until BODY_ROW_BYTES, and the rows of a topic tile
its ids (store/schema.py)."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from ppmq.store.schema import (
    BODY_ROW_BYTES,
    GROUP_MESSAGES,
    TM,
    Body,
    body_columns,
    body_records,
    decode_body,
    encode_body,
    encode_body_row,
)
from ppmq.store.store import Store, Txn
from tests.unit.conftest import writing

T = 7  # a topic id


def body(m: int, size: int = 10, expires_ns: int = 0) -> Body:
    return Body(m % 3, 1_000 + m, expires_ns, b"k%d" % m, b'"%s"' % (b"x" * size))


def rows(txn: Txn, t: int = T) -> list[tuple[int, list[int]]]:
    """Each row of topic t: its key's id and the ids it holds."""
    with txn.txn.cursor(db=txn.store.dbs["bodies"]) as cur:
        return [(TM.unpack(key)[1], list(body_columns(raw)[0])) for key, raw in cur if TM.unpack(key)[0] == t]


def publish(txn: Txn, first: int, last: int, size: int = 10, t: int = T) -> None:
    txn.put_records(t, first, [encode_body(body(m, size)) for m in range(first, last + 1)])


def test_a_publish_is_stored_in_rows_of_at_most_GROUP_MESSAGES_keyed_by_their_first_id(txn):
    publish(txn, 1, 2 * GROUP_MESSAGES + 44)
    assert [(key, len(ids)) for key, ids in rows(txn)] == [
        (1, GROUP_MESSAGES),
        (GROUP_MESSAGES + 1, GROUP_MESSAGES),
        (2 * GROUP_MESSAGES + 1, 44),
    ]
    assert txn.get_body(T, GROUP_MESSAGES + 5) == body(GROUP_MESSAGES + 5)
    assert txn.publish_ns(T, GROUP_MESSAGES + 5) == 1_000 + GROUP_MESSAGES + 5


def test_a_publish_of_large_messages_starts_a_row_once_one_reaches_BODY_ROW_BYTES(txn):
    size = BODY_ROW_BYTES // 4 - 100  # four are just under it, five past it
    publish(txn, 1, 12, size)
    assert rows(txn) == [(1, [1, 2, 3, 4, 5]), (6, [6, 7, 8, 9, 10]), (11, [11, 12])]
    assert [m for m, _ in txn.bodies_of(T)] == list(range(1, 13))


def test_a_deleted_message_is_cut_out_of_its_row_and_an_emptied_row_is_deleted(txn):
    # Given two publishes, 1..5 (3 expiring, on a Dedupe topic's keys) and 6..10
    txn.put_records(T, 1, [encode_body(body(m, expires_ns=50 if m == 3 else 0)) for m in range(1, 6)])
    publish(txn, 6, 10)
    # When 2..7 are popped (and 99, which is not stored)
    popped = txn.pop_bodies(T, [7, 2, 3, 4, 5, 6, 99], keys=True)
    # Then each row keeps its key and the others, and the counts, sizes, expiries and keys are those of what left
    assert rows(txn) == [(1, [1]), (6, [8, 9, 10])]
    assert (popped.count, popped.size) == (6, 6 * len(body(0).fragment))
    assert popped.expiries == [(50, 3)] and popped.keys == [b"k%d" % m for m in range(2, 8)]
    assert txn.get_body(T, 1) == body(1) and txn.get_body(T, 6) is None and txn.get_body(T, 8) == body(8)
    # and a row that loses all its messages goes
    txn.pop_bodies(T, [1], keys=False)
    assert rows(txn) == [(6, [8, 9, 10])]


def test_a_row_popped_whole_gives_the_counts_expiries_and_keys_of_all_it_held(txn):
    # keys of one and of two digits: the records' heads differ in length
    txn.put_records(T, 8, [encode_body(body(m, size=m, expires_ns=50 if m in (9, 11) else 0)) for m in range(8, 12)])
    popped = txn.pop_bodies(T, [11, 8, 10, 9, 99], keys=True)
    assert rows(txn) == []
    assert (popped.count, popped.size) == (4, sum(len(body(m, size=m).fragment) for m in range(8, 12)))
    assert popped.expiries == [(50, 9), (50, 11)] and popped.keys == [b"k8", b"k9", b"k10", b"k11"]


def test_a_message_published_alone_goes_with_its_row_and_gives_its_size_expiry_and_key(txn):
    # Given three publishes of one message each, the second expiring
    for m in (5, 6, 7):
        txn.put_records(T, m, [encode_body(body(m, size=m, expires_ns=50 if m == 6 else 0))])
    # When the second and the third are popped, one at a time
    popped = txn.pop_bodies(T, [6], keys=True)
    assert (popped.count, popped.size, popped.expiries, popped.keys) == (1, len(body(6, size=6).fragment), [(50, 6)], [b"k6"])
    popped = txn.pop_bodies(T, [7], keys=False)
    assert (popped.count, popped.size, popped.expiries, popped.keys) == (1, len(body(7, size=7).fragment), [], [])
    # Then their rows are gone, and a message popped again, or never stored, counts nothing
    assert rows(txn) == [(5, [5])]
    assert txn.pop_bodies(T, [7], keys=True).count == 0 and txn.pop_bodies(T, [8], keys=True).count == 0
    assert rows(txn) == [(5, [5])]


def test_a_message_popped_alone_from_a_row_it_shares_leaves_the_others_there(txn):
    # Given a publish of 3..5, whose row is keyed by 3
    publish(txn, 3, 5)
    # When 3, then 4 are popped one at a time, the row keeps its key and the others
    assert txn.pop_bodies(T, [3], keys=True).keys == [b"k3"]
    assert rows(txn) == [(3, [4, 5])]
    assert txn.pop_bodies(T, [4], keys=True).keys == [b"k4"]
    assert rows(txn) == [(3, [5])]
    # Then 3, no longer stored, counts nothing, though its key names the row that holds 5 alone
    assert txn.pop_bodies(T, [3], keys=True).count == 0 and rows(txn) == [(3, [5])]
    # And the row goes with 5
    assert txn.pop_bodies(T, [5], keys=True).keys == [b"k5"]
    assert rows(txn) == []


def test_a_new_version_takes_the_old_ones_place_in_its_row(txn):
    publish(txn, 1, 5)
    assert txn.put_body(T, 3, body(3, size=500)) == body(3)
    assert rows(txn) == [(1, [1, 2, 3, 4, 5])]
    assert [b for _, b in txn.bodies_of(T)] == [body(1), body(2), body(3, size=500), body(4), body(5)]


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 300)), max_size=8))
@settings(max_examples=60, deadline=None)
def test_new_versions_spliced_into_a_row_leave_every_other_record_as_it_was(versions):
    """Each new version, larger or smaller, first or last in its row, is cut in
    where the old one was: the row reads back as if written whole."""
    with tempfile.TemporaryDirectory() as d, writing(d) as txn:
        publish(txn, 1, 5)
        expected = {m: body(m) for m in range(1, 6)}
        for m, size in versions:
            assert txn.put_body(T, m, body(m, size=size)) == expected[m]
            expected[m] = body(m, size=size)
        assert rows(txn) == [(1, [1, 2, 3, 4, 5])]
        assert dict(txn.bodies_of(T)) == expected


def test_a_new_version_too_large_for_its_row_splits_it(txn):
    publish(txn, 1, 4, size=BODY_ROW_BYTES // 2)
    txn.put_body(T, 4, body(4, size=BODY_ROW_BYTES))
    assert rows(txn) == [(1, [1, 2]), (3, [3, 4])]
    assert dict(txn.bodies_of(T)) == {
        1: body(1, BODY_ROW_BYTES // 2),
        2: body(2, BODY_ROW_BYTES // 2),
        3: body(3, BODY_ROW_BYTES // 2),
        4: body(4, BODY_ROW_BYTES),
    }


def test_put_body_of_a_message_in_no_row_joins_the_row_below_it_or_starts_one_below_all(txn):
    publish(txn, 10, 12)
    txn.put_body(T, 11_000, body(11_000))  # above every id: the last row's range
    txn.put_body(T, 5, body(5))  # below every row
    assert rows(txn) == [(5, [5]), (10, [10, 11, 12, 11_000])]


def test_put_body_splits_a_row_that_an_insert_takes_past_GROUP_MESSAGES(txn):
    publish(txn, 1, GROUP_MESSAGES)
    txn.put_body(T, GROUP_MESSAGES + 1, body(0))
    half = (GROUP_MESSAGES + 1) // 2
    assert rows(txn) == [(1, list(range(1, half + 1))), (half + 1, list(range(half + 1, GROUP_MESSAGES + 2)))]


def test_a_publish_shares_a_row_and_indexes_each_key_and_each_expiry_from_the_same_columns(txn):
    published = {m: Body(m % 3, 1_000, 0 if m == 2 else 5_000 + m, b"k%d" % m, b'"x"') for m in range(1, 4)}
    prios, _, expiries, keys, fragments = zip(*published.values())
    txn.put_messages(T, 1, prios, 1_000, expiries, keys, fragments, dedupe=True, expire=True)
    assert rows(txn) == [(1, [1, 2, 3])]
    assert dict(txn.bodies_of(T)) == published
    assert [txn.get_dedupe(T, b"k%d" % m) for m in range(1, 4)] == [1, 2, 3]
    assert txn.due_expiries(10_000, 10) == [(5_001, T, 1), (5_003, T, 3)]  # none for one that never expires


def test_topics_keep_to_their_own_rows(txn):
    publish(txn, 1, 3)
    publish(txn, 1, 2, t=T + 1)
    publish(txn, 9, 9, t=T - 1)
    assert rows(txn) == [(1, [1, 2, 3])] and rows(txn, T + 1) == [(1, [1, 2])]
    assert [m for m, _ in txn.bodies_of(T)] == [1, 2, 3] and txn.get_body(T + 1, 3) is None


# A sequence of operations on one topic, compared with a dict: publishes of new
# ids (above every stored one), pops of any ids or of a run, new versions of stored ones,
# and puts of ids anywhere.
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 300), st.sampled_from([5, 300, BODY_ROW_BYTES // 3])),
        st.tuples(st.just("pop"), st.lists(st.integers(0, 1_500), max_size=80), st.booleans()),
        # stored messages one after another (from the i-th on), as the last ack of a batch of one priority pops
        st.tuples(st.just("pop stored"), st.integers(0, 600), st.integers(1, 150), st.booleans()),
        st.tuples(st.just("version"), st.integers(0, 1_500), st.integers(1, 2_000)),
        st.tuples(st.just("put"), st.integers(0, 1_500), st.integers(1, 2_000)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_any_sequence_of_operations_keeps_what_a_dict_would_and_rows_that_tile_the_ids(ops):
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(tmp, sync=False, max_bytes=1 << 28)
        try:
            with store.write() as txn:
                model: dict[int, Body] = {}
                seq = 0
                for op in ops:
                    if op[0] == "publish":
                        new = [(m, body(m, op[2])) for m in range(seq + 1, seq + op[1] + 1)]
                        txn.put_records(T, seq + 1, [encode_body(b) for _, b in new])
                        model.update(new)
                        seq += op[1]
                    elif op[0] in ("pop", "pop stored"):
                        if op[0] == "pop stored":
                            op = ("pop", sorted(model)[op[1] : op[1] + op[2]], op[3])
                        popped = txn.pop_bodies(T, op[1], keys=op[2])
                        gone = sorted(set(op[1]) & model.keys())
                        assert (popped.count, popped.size) == (len(gone), sum(len(model[m].fragment) for m in gone))
                        assert popped.keys == ([model[m].key for m in gone] if op[2] else [])
                        for m in gone:
                            del model[m]
                    elif op[0] == "version" and op[1] in model or op[0] == "put":
                        txn.put_body(T, op[1], body(op[1], op[2]))
                        model[op[1]] = body(op[1], op[2])
                        seq = max(seq, op[1])  # a publish's ids are above every stored one
                assert list(txn.bodies_of(T)) == sorted(model.items())
                assert all(txn.get_body(T, m) == b for m, b in model.items())
                tiled = rows(txn)
                assert [m for _, ids in tiled for m in ids] == sorted(model)
                for (key, ids), upper in zip(tiled, [key for key, _ in tiled[1:]] + [1 << 64]):
                    assert key <= ids[0] and ids[-1] < upper and len(ids) <= GROUP_MESSAGES
        finally:
            store.close()


@given(
    st.lists(st.tuples(st.integers(0, 255), st.integers(0, 2**63), st.binary(max_size=8), st.binary(max_size=300)), min_size=1, max_size=4)
)
def test_records_and_a_row_of_one_message_are_what_the_columns_of_several_make(messages):
    bodies = [Body(prio, 123, expires_ns, key, fragment) for prio, expires_ns, key, fragment in messages]
    prios, publish_ns, expiries, keys, fragments = zip(*bodies)
    records = body_records(prios, 123, expiries, keys, fragments)
    assert records == [body_records((b.priority,), 123, (b.expires_ns,), (b.key,), (b.fragment,))[0] for b in bodies]
    assert [decode_body(record) for record in records] == bodies
    with tempfile.TemporaryDirectory() as d, writing(d) as txn:
        txn.put_records(T, 5, records[:1])
        assert rows(txn) == [(5, [5])]
        assert txn.txn.get(TM.pack(T, 5), db=txn.store.dbs["bodies"]) == encode_body_row([5], records[:1])
