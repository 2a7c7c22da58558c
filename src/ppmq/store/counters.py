"""The broker's counters as the store keeps them: one record per topic, written
when a step touched that topic, and put back the same way when a request or a
step fails.

State (store/state.py) is small per topic, but as one record a broker with hundreds of
topics would pay for all of them at every step: encoding them all to save, and
again before every request so that a failed one can be undone. Instead State's
two per-topic dicts are Tracked: they note which topics a step looks up, and the
first lookup of a topic in a request keeps a copy of its counters as they were.
A failed request puts back what it touched; a commit writes the records of the
topics touched, and the small head record (sequences of dropped topics, name
ids, global counters); a failed step reads back the records of what it touched.
So a step costs in proportion to the topics it works on.

Only the writer thread, inside a step, touches; the event loop reads the
counters between steps (or beside a step, racing it as it always did) through
`peek`, which notes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import Any

import msgspec

from ppmq.store.state import State, SubStats, TopicStats, Tracked

HEAD_KEY = b"state"  # meta: the counters that are not per topic (StateHead)
TOPIC_PREFIX = b"topic:"  # meta TOPIC_PREFIX + name: one topic's counters (TopicRecord)
_MISSING = object()


class StateHead(msgspec.Struct):
    """State without its per-topic dicts: the head record. An older ppmq wrote the
    whole State under the same key; it decodes as a State with the topics in it."""

    rejected: int = 0
    commits: int = 0
    forbidden: int = 0
    topic_ids: dict[str, int] = {}
    sub_ids: dict[str, int] = {}
    dropped_seqs: dict[str, int] = {}


class TopicRecord(msgspec.Struct, array_like=True):
    stats: TopicStats
    subs: dict[str, SubStats]


_encode = msgspec.msgpack.Encoder().encode
_decode_state = msgspec.msgpack.Decoder(State).decode
_decode_topic = msgspec.msgpack.Decoder(TopicRecord).decode
_decode_topic_stats = msgspec.msgpack.Decoder(TopicStats).decode
_decode_subs = msgspec.msgpack.Decoder(dict[str, SubStats]).decode


class Ledger:
    """What a step touches of one State: undo levels for its requests, the
    records it writes, and the way back to the committed records when it fails."""

    def __init__(self, state: State) -> None:
        self.state = state
        state.topics = Tracked(state.topics, self)
        state.subs = Tracked(state.subs, self)
        self.stepping = False  # touches are noted only inside a step
        self.levels: list[dict[tuple[int, str], Any]] = []  # per open request level: (dict id, key) -> image
        self._heads: list[tuple] = []  # per open request level: the head's values
        self.touched: set[str] = set()  # topics touched since take_touched
        self._keys: dict[str, bytes] = {}  # topic -> the meta key of its record

    # --- the step -----------------------------------------------------------------
    def step(self) -> None:
        """A step starts: from now on, what it touches is noted."""
        self.stepping = True
        dict.clear(self.state.topics)  # _forget_seen's, without a call of its own: every step starts here
        dict.clear(self.state.subs)

    def stepped(self) -> set[str]:
        """The step committed: the topics it touched, taken as take_touched does."""
        self.stepping = False
        touched, self.touched = self.touched, set()
        return touched

    def rollback(self, committed: Callable[[bytes], bytes | None]) -> None:
        """The step failed: what it touched goes back to the records the store
        holds, read through `committed` (a meta record's bytes, or None). A step
        keeps no copies of its own: every touched topic's record was written by
        the last commit, and failures are rare."""
        self.stepping = False
        self.levels.clear()
        self._heads.clear()
        state = self.state
        raw = committed(HEAD_KEY)
        _set_head(state, _head_values(_decode_state(raw) if raw is not None else State()))
        for name in self.touched:
            raw = committed(TOPIC_PREFIX + name.encode())
            record = _decode_topic(raw) if raw is not None else None
            _put_back(state.topics, name, _MISSING if record is None else record.stats)
            _put_back(state.subs, name, _MISSING if record is None else record.subs)
        self._forget_seen()

    def take_touched(self) -> set[str]:
        """The topics touched since the last call: once a step has ended (or been
        rolled back), what its caller's indexes of the counters look at again."""
        touched, self.touched = self.touched, set()
        return touched

    # --- request levels -------------------------------------------------------------
    def begin(self) -> None:
        """A request starts: what it touches from now on can be put back."""
        self.levels.append({})
        self._heads.append(_head_values(self.state))
        self._forget_seen()

    def end(self) -> None:
        """The request succeeded: keep what it did."""
        self.levels.pop()
        self._heads.pop()

    def undo(self) -> None:
        """The request failed: put back what it touched."""
        images = self.levels.pop()
        head = self._heads.pop()
        state = self.state
        dicts: dict[int, Tracked[Any]] = {id(state.topics): state.topics, id(state.subs): state.subs}
        for (which, key), image in images.items():
            _put_back(dicts[which], key, _restored(image))
        _set_head(state, head)
        self._forget_seen()

    def touch(self, tracked: Tracked, key: str) -> None:
        """Note `key` of `tracked` as touched, imaged at every open request level
        that has no image of it yet; outside a step, note nothing."""
        if not self.stepping:
            return
        self.touched.add(key)
        image = None
        for level in self.levels:
            if (id(tracked), key) not in level:
                if image is None:
                    image = _image(tracked.rows.get(key, _MISSING))
                level[id(tracked), key] = image

    def _forget_seen(self) -> None:
        """A new level images anew: each dict's first lookup in it is noted.
        What the dicts held is gone too after a rollback or an undo, which put
        back other values."""
        dict.clear(self.state.topics)
        dict.clear(self.state.subs)

    # --- records ------------------------------------------------------------------
    def end_step(self, txn: Any) -> bool:
        """The step ends, before its commit: the sequences of the topics it
        touched renew their reservations (TopicStats.reserve), and their
        records and the head go into txn (save). True if the step handed out
        ids above the reservation the last commit made: its batches, which may
        carry them as keys, wait for its commit."""
        topics, held = self.state.topics.rows, False
        for name in self.touched:
            if name in topics and topics[name].reserve():
                held = True
        self.save(txn)
        return held

    def save(self, txn: Any, everything: bool = False) -> None:
        """The head and the touched topics' records (every topic's with
        `everything`) into txn; a topic no longer counted loses its record."""
        state, keys = self.state, self._keys
        topics, subs = state.topics.rows, state.subs.rows  # a topic's counters come with its subscribers' (State.register)
        for name in topics.keys() | self.touched if everything else self.touched:
            if name not in keys:
                keys[name] = TOPIC_PREFIX + name.encode()
            if name in topics:
                txn.put_meta(keys[name], _encode(TopicRecord(topics[name], subs[name])))
            else:
                txn.delete_meta(keys.pop(name))
        txn.put_meta(HEAD_KEY, _encode(StateHead(*_head_values(state))))


def load_state(txn: Any) -> State:
    """The counters a store holds: the head record, then one record per topic (a
    head written by an older ppmq holds every topic itself)."""
    raw = txn.get_meta(HEAD_KEY)
    state = _decode_state(raw) if raw is not None else State()
    for name, record in _topic_records(txn):
        state.topics[name] = record.stats
        state.subs[name] = record.subs
    return state


def _topic_records(txn: Any) -> Iterator[tuple[str, TopicRecord]]:
    for key, raw in txn.meta_items(TOPIC_PREFIX):
        yield key[len(TOPIC_PREFIX) :].decode(), _decode_topic(raw)


# The head's counters, in StateHead's field order (StateHead names them once). Its
# dicts are replaced, not changed, by a reload (State.register, State.forget), so
# keeping them is keeping them as they are.
_head_values: Callable[[State], tuple] = attrgetter(*StateHead.__struct_fields__)


def _set_head(state: State, values: tuple) -> None:
    """Put back the head's counters that _head_values read."""
    for name, value in zip(StateHead.__struct_fields__, values):
        setattr(state, name, value)


def _put_back(tracked: Tracked, key: str, value: Any) -> None:
    """Put an entry back as it was, noting nothing: the ledger forgets what the
    dict itself held afterwards."""
    if value is _MISSING:
        tracked.rows.pop(key, None)
    else:
        tracked.rows[key] = value


def _image(value: Any) -> Any:
    """What a request level keeps of a topic's entry: its counters encoded (one C
    call, and later changes to the live values cannot reach it), or _MISSING."""
    return value if value is _MISSING else (type(value), _encode(value))


def _restored(image: Any) -> Any:
    if image is _MISSING:
        return image
    kind, raw = image
    return _decode_topic_stats(raw) if kind is TopicStats else _decode_subs(raw)
