"""The holders rows (store/holders.py): the messages of a publish share a row, up to
GROUP_MESSAGES of them, and the rows of a topic tile its ids (store/schema.py)."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from ppmq.store import holders as holder_rows
from ppmq.store.schema import GROUP_MESSAGES, HOLDER, TM, encode_holders_row, holders_columns, new_holders_row
from ppmq.store.store import Store, Txn

T = 7  # a topic id
A, B, C = 1, 2, 3  # subscriber ids


def rows(txn: Txn, t: int = T) -> list[tuple[int, list[int]]]:
    """Each row of topic t: its key's id and the ids it holds."""
    with txn.txn.cursor(db=txn.store.dbs["holders"]) as cur:
        return [(TM.unpack(key)[1], list(holders_columns(raw)[0])) for key, raw in cur if TM.unpack(key)[0] == t]


def publish(txn: Txn, first: int, last: int, subs: tuple[int, ...] = (A, B)) -> None:
    txn.put_new_holders(T, list(subs), first, [m % 3 for m in range(first, last + 1)])


def test_a_publish_is_stored_in_rows_of_at_most_GROUP_MESSAGES_keyed_by_their_first_id(txn):
    publish(txn, 1, 2 * GROUP_MESSAGES + 44)
    assert [(key, len(ids)) for key, ids in rows(txn)] == [
        (1, GROUP_MESSAGES),
        (GROUP_MESSAGES + 1, GROUP_MESSAGES),
        (2 * GROUP_MESSAGES + 1, 44),
    ]
    assert txn.get_holders(T, GROUP_MESSAGES + 5) == {
        A: ((GROUP_MESSAGES + 5) % 3, GROUP_MESSAGES + 5),
        B: ((GROUP_MESSAGES + 5) % 3, GROUP_MESSAGES + 5),
    }


def test_a_release_across_two_rows_returns_what_nobody_holds_any_more(txn):
    # Given two publishes, 1..5 and 6..10, held by A and B
    publish(txn, 1, 5)
    publish(txn, 6, 10)
    # When A lets go of 4..7, nobody is done with them yet
    assert txn.release_holders(T, A, [7, 4, 6, 5]) == []
    # And when B lets go of 3..7, the ones A had let go of are done, ascending
    assert txn.release_holders(T, B, [3, 4, 5, 6, 7]) == [4, 5, 6, 7]
    # Then each row keeps its key, even the one whose first messages left
    assert rows(txn) == [(1, [1, 2, 3]), (6, [8, 9, 10])]
    assert txn.get_holders(T, 3) == {A: (0, 3)} and txn.get_holders(T, 6) == {}


def test_a_message_leaves_the_middle_of_its_row(txn):
    publish(txn, 1, 5)
    txn.release_holders(T, B, [3])
    assert rows(txn) == [(1, [1, 2, 3, 4, 5])] and txn.get_holders(T, 3) == {A: (0, 3)}
    assert txn.release_holders(T, A, [3]) == [3]
    assert rows(txn) == [(1, [1, 2, 4, 5])] and txn.get_holders(T, 3) == {}


def test_a_release_of_a_subscriber_at_different_places_among_the_holders(txn):
    # Given messages held by A, B and C in different orders and numbers
    publish(txn, 1, 3, (A, B, C))
    publish(txn, 4, 6, (C, A))
    txn.put_holders(T, 2, {C: (1, 50), A: (2, 2)})
    # When A lets go of all of them, then only those it held last are done
    assert txn.release_holders(T, A, [1, 2, 3, 4, 5, 6]) == []
    assert txn.release_holders(T, C, [1, 2, 3, 4, 5, 6]) == [2, 4, 5, 6]
    assert [txn.get_holders(T, m) for m in (1, 3)] == [{B: (1, 1)}, {B: (0, 3)}]
    assert rows(txn) == [(1, [1, 3])]


def test_an_emptied_row_is_deleted(txn):
    publish(txn, 1, 4)
    publish(txn, 5, 6)
    txn.release_holders(T, A, [1, 2, 3, 4, 5])
    assert txn.release_holders(T, B, [1, 2, 3, 4]) == [1, 2, 3, 4]
    assert rows(txn) == [(5, [5, 6])]


def test_ids_that_no_row_holds_are_released_as_done(txn):
    publish(txn, 5, 7)
    txn.release_holders(T, A, [6])
    txn.release_holders(T, B, [6])
    assert txn.release_holders(T, A, [2, 6, 9, 5]) == [2, 6, 9]
    assert rows(txn) == [(5, [5, 7])]


def test_put_holders_of_a_message_in_no_row_joins_the_row_below_it_or_starts_one_below_all(txn):
    # Given rows 5..7 and 20..22, and messages 3 and 10 that no row holds
    publish(txn, 5, 7)
    publish(txn, 20, 22)
    # When 10 gets holders, it joins the row whose range it is in: 5's
    txn.put_holders(T, 10, {A: (0, 30)})
    # And 3, below every row, starts a row of its own
    txn.put_holders(T, 3, {B: (2, 3)})
    assert rows(txn) == [(3, [3]), (5, [5, 6, 7, 10]), (20, [20, 21, 22])]
    assert txn.get_holders(T, 10) == {A: (0, 30)} and txn.get_holders(T, 3) == {B: (2, 3)}
    # And a message whose holders are put empty leaves its row
    txn.put_holders(T, 6, {})
    txn.put_holders(T, 3, {})
    assert rows(txn) == [(5, [5, 7, 10]), (20, [20, 21, 22])]


def test_put_holders_splits_a_row_that_an_insert_takes_past_GROUP_MESSAGES(txn):
    publish(txn, 1, GROUP_MESSAGES)
    txn.put_holders(T, GROUP_MESSAGES + 7, {A: (0, 1)})
    half = (GROUP_MESSAGES + 1) // 2
    assert rows(txn) == [(1, list(range(1, half + 1))), (half + 1, [*range(half + 1, GROUP_MESSAGES + 1), GROUP_MESSAGES + 7])]
    assert txn.get_holders(T, GROUP_MESSAGES) == {A: (GROUP_MESSAGES % 3, GROUP_MESSAGES), B: (GROUP_MESSAGES % 3, GROUP_MESSAGES)}


def test_pop_holders_takes_messages_out_of_their_rows_with_their_holders(txn):
    publish(txn, 1, 4)
    publish(txn, 5, 6)
    assert txn.pop_holders(T, [4, 2, 5, 9]) == {2: {A: (2, 2), B: (2, 2)}, 4: {A: (1, 4), B: (1, 4)}, 5: {A: (2, 5), B: (2, 5)}}
    assert rows(txn) == [(1, [1, 3]), (5, [6])]


def test_topics_keep_to_their_own_rows(txn):
    publish(txn, 1, 3)
    txn.put_new_holders(T + 1, [A], 1, [0, 0])
    txn.put_holders(T + 1, 0, {A: (0, 0)})
    assert txn.release_holders(T, A, [1, 2, 3]) == []
    assert rows(txn) == [(1, [1, 2, 3])] and rows(txn, T + 1) == [(0, [0]), (1, [1, 2])]


# --- against a model: any sequence of operations ----------------------------------------

SUBS = st.lists(st.sampled_from([A, B, C]), min_size=1, max_size=3, unique=True)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), SUBS, st.integers(1, 9)),
        st.tuples(st.just("release"), st.sampled_from([A, B, C]), st.lists(st.integers(0, 40), max_size=12)),
        st.tuples(
            st.just("put"),
            st.integers(0, 40),
            st.dictionaries(st.sampled_from([A, B, C]), st.tuples(st.integers(0, 2), st.integers(0, 99))),
        ),
        st.tuples(st.just("pop"), st.lists(st.integers(0, 40), max_size=6)),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_any_sequence_of_operations_keeps_what_a_dict_would_and_rows_that_tile_the_ids(ops):
    # rows of at most 4 messages, so that rows fill, split and empty often
    holder_rows.GROUP_MESSAGES, real = 4, holder_rows.GROUP_MESSAGES
    try:
        with tempfile.TemporaryDirectory() as d:
            store = Store(d, sync=False, max_bytes=1 << 24)
            try:
                with store.write() as txn:
                    run_against_model(txn, ops)
            finally:
                store.close()
    finally:
        holder_rows.GROUP_MESSAGES = real


def run_against_model(txn: Txn, ops: list[tuple]) -> None:
    model: dict[int, dict[int, tuple[int, int]]] = {}
    seq = 0  # the last id published: put_new_holders takes new ids only
    for op, *args in ops:
        if op == "publish":
            subs, n = args
            new = [(m, m % 3) for m in range(seq + 1, seq + n + 1)]
            txn.put_new_holders(T, subs, seq + 1, [prio for _, prio in new])
            model.update((m, dict.fromkeys(subs, (prio, m))) for m, prio in new)
            seq += n
        elif op == "release":
            s, ms = args
            for m in ms:
                model.get(m, {}).pop(s, None)
            assert txn.release_holders(T, s, ms) == sorted(m for m in set(ms) if not model.get(m))
        elif op == "put" and args[0] <= seq:  # the broker puts holders of messages it stored
            m, holders = args
            txn.put_holders(T, m, holders)
            model[m] = dict(holders)
        elif op == "pop":
            popped = txn.pop_holders(T, args[0])
            assert popped == {m: model[m] for m in set(args[0]) if model.get(m)}
            for m in args[0]:
                model.pop(m, None)
        model = {m: holders for m, holders in model.items() if holders}
        assert {m: txn.get_holders(T, m) for m in range(seq + 2)} == {m: model.get(m, {}) for m in range(seq + 2)}
        assert_rows_tile(rows(txn), model)


def assert_rows_tile(found: list[tuple[int, list[int]]], model: dict[int, dict]) -> None:
    """Keys at or below their ids, ids ascending and below the next key, no row
    empty or over GROUP_MESSAGES, and exactly the held messages in them."""
    for i, (key, ids) in enumerate(found):
        assert 0 < len(ids) <= holder_rows.GROUP_MESSAGES and key <= ids[0] and ids == sorted(set(ids))
        if i + 1 < len(found):
            assert ids[-1] < found[i + 1][0]
    assert sorted(m for _, ids in found for m in ids) == sorted(model)


def test_a_release_finds_the_subscribers_own_entry_when_its_id_bytes_appear_in_another_entry(txn):
    # Given messages held by C then A, at a position whose bytes include A's id (00 01)
    txn.put_holders(T, 1, {C: (0, 0x0001_0001), A: (1, 0x0001_0001)})
    txn.put_holders(T, 2, {C: (0, 0x0001_0002), A: (1, 0x0001_0002)})
    # When A lets go of both, C's entries stay whole
    assert txn.release_holders(T, A, [1, 2]) == []
    assert txn.get_holders(T, 1) == {C: (0, 0x0001_0001)} and txn.get_holders(T, 2) == {C: (0, 0x0001_0002)}


def test_a_message_published_alone_is_let_go_of_by_each_holder_in_turn(txn):
    # Given a publish of one message, held by A, B and C, in a row of its own;
    # its position's bytes hold B's id (00 02), before B's own entry
    txn.put_new_holders(T, [C, B, A], 0x0002_0002, [1])
    m = 0x0002_0002
    # When B, then a subscriber that does not hold it, then C let go of it, it is not done
    assert txn.release_holders(T, B, [m]) == []
    assert txn.get_holders(T, m) == {C: (1, m), A: (1, m)}
    assert txn.release_holders(T, B, [m]) == []
    assert txn.release_holders(T, C, [m]) == []
    assert txn.get_holders(T, m) == {A: (1, m)}
    # And when A, its last holder, lets go of it, it is done and its row goes
    assert txn.release_holders(T, A, [m]) == [m]
    assert rows(txn) == []


@given(
    st.lists(st.integers(0, 65535), max_size=5, unique=True), st.integers(1, 2**40), st.lists(st.integers(0, 255), min_size=1, max_size=3)
)
def test_a_row_of_new_messages_is_the_row_its_columns_encode_whether_one_or_more(subs, first, prios):
    ids = range(first, first + len(prios))
    entries = b"".join(HOLDER.pack(s, prio, m) for prio, m in zip(prios, ids) for s in subs)
    assert new_holders_row(subs, first, prios) == encode_holders_row(ids, [len(subs)] * len(prios), entries)


def test_a_release_of_a_message_whose_row_holds_another_alone_changes_only_that_message(txn):
    # Given a publish of 3 and 4, whose row is keyed by 3, and 3 done with
    publish(txn, 3, 4)
    assert txn.release_holders(T, A, [3]) == [] and txn.release_holders(T, B, [3]) == [3]
    assert rows(txn) == [(3, [4])]
    # When A lets go of 3 again, nothing changes: nobody holds it
    assert txn.release_holders(T, A, [3]) == [3]
    assert rows(txn) == [(3, [4])] and txn.get_holders(T, 4) == {A: (1, 4), B: (1, 4)}
    # And when A, then B let go of 4, the row goes with it
    assert txn.release_holders(T, A, [4]) == []
    assert txn.release_holders(T, B, [4]) == [4]
    assert rows(txn) == []
