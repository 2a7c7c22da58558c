"""A publish too large for one step, stored over several, unseen until it is whole.

One step of the broker is one transaction, and the writer serves nobody else
while it runs: a 16 MiB frame of tiny messages (over a million of them) would
stall every client and subscriber for seconds. So a publish of more than
CHUNK_MESSAGES messages is validated and stored CHUNK_MESSAGES at a time, one
chunk per step, beside the other requests of those steps:

- its first chunk reserves ids for all its messages from the topic's sequence
  and writes the meta `staging` record naming that range (store.Staged);
- each chunk writes ordinary rows (bodies, holders, ready and expiry entries)
  that the store's walks skip while the record names them, and moves no counter;
- the step of its last chunk makes it visible at once: the counters, the
  wrapper's acks and command, the record cleared, the journal, the one reply.

So the client sees it applied whole or not at all, answered once, durable when
answered 200. A chunk that fails (validation, store full), a reload that
changes the topic, or a commit that fails ends it with an error reply; the rows
it left become an orphan range, deleted CHUNK_MESSAGES at a time in the next
steps, and its ids are never handed out again. A record found at start is such
an orphan too: a crash while staging, whose client never had its 200.

Only topics whose messages simply append can stage unseen: a Dedupe key
replaces a visible message, and MaxMessages or MaxBytes may drop one, so there
a publish of more than CHUNK_MESSAGES is refused (413). One publish stages at a
time; the next ones wait their turn, in order of arrival.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ppmq.config import TopicConfig
from ppmq.core import events as ev
from ppmq.core.events import Event
from ppmq.core.validate import Prepared, delayed, prepare
from ppmq.errors import RequestError, TooLarge, Unavailable
from ppmq.protocol import messages as p
from ppmq.store.schema import Staged
from ppmq.store.state import TopicStats
from ppmq.store.store import Txn

CHUNK_MESSAGES = 20_000  # per step: about a tenth of a second of the writer's time


def is_large(topic: TopicConfig, messages: list[p.Message]) -> bool:
    """Whether a publish must be staged; TooLarge if it cannot be (see the module doc)."""
    if len(messages) <= CHUNK_MESSAGES:
        return False
    why = _unstageable(topic, messages)
    if why:
        raise TooLarge(
            f"Messages: {len(messages)} messages in one publish {why}, which takes at most {CHUNK_MESSAGES} in one request: split it"
        )
    return True


def _unstageable(topic: TopicConfig, messages: list[p.Message]) -> str | None:
    """Why a publish cannot be stored in chunks: each of its messages must see
    the ones before it (a key, a limit), or waits in rows the chunks do not write."""
    if topic.dedupe:
        return f"to topic {topic.name!r}, which has Dedupe"
    if topic.limited:
        return f"to topic {topic.name!r}, which has MaxMessages or MaxBytes"
    if delayed(messages):
        return "with messages that wait (Delay, NotBefore)"
    return None


@dataclass(eq=False)
class Job:
    """A publish being staged, and what its chunks stored so far."""

    req: p.Request
    messages: list[p.Message]  # req's Messages
    topic: TopicConfig  # as it was when the publish arrived: a reload that changes it ends the job
    arrived_ns: int  # TTLs count from here, and every message is stamped published then
    event: Event | None  # its PUBLISH journal event, filled chunk by chunk; None without a journal
    staged: Staged | None = None  # the ids reserved by its first chunk
    done: int = 0  # messages validated (and stored, when the topic has subscribers)
    ready: list[int] = field(default_factory=list)  # messages stored, per priority
    stored_bytes: int = 0  # their JSON as delivered

    @property
    def whole(self) -> bool:
        return self.done == len(self.messages)


Answer = tuple[p.Request, p.Reply]


class Staging:
    """The publishes waiting to be staged, the one in progress, and the rows of an
    ended one still to delete; one staging record in the store at a time."""

    def __init__(self, record: Staged | None) -> None:
        self._waiting: deque[Job] = deque()
        self._active: Job | None = None
        self._orphan = record  # rows to delete before anything else stages
        self._committed = record  # the record as of the last commit
        self._uncommitted = record  # the record as the current step leaves it
        self._new: list[Job] = []  # queued in the current step
        self._touched: Job | None = None  # the job the current step worked on
        # Steps are needed even without requests: a job to advance, rows to
        # delete. Kept by every change to the three above (_note_busy), so
        # that a step asks it without a call.
        self.busy = record is not None

    def _note_busy(self) -> None:
        self.busy = bool(self._active or self._waiting or self._orphan)

    def job_of(self, req: p.Request) -> Job | None:
        """The job whose turn it is, if req is its request; None for a newcomer."""
        return self._active if self._active is not None and self._active.req is req else None

    def queue(self, req: p.Request, topic: TopicConfig, now_ns: int, journaled: bool) -> None:
        assert req.messages is not None, "a publish large enough to stage (is_large)"
        event = ev.new(ev.PUBLISH, now_ns, topic.name) if journaled else None
        job = Job(req, req.messages, topic, now_ns, event, ready=[0] * topic.priorities)
        self._waiting.append(job)
        self._new.append(job)
        self.busy = True

    def step(self, txn: Txn, apply: Callable[[p.Request], p.Reply | None]) -> list[Answer]:
        """One chunk of work: an orphan's rows deleted, or the next chunk of the job
        whose turn it is, through `apply` (the broker's request path), which answers
        None until the job is whole. Returns the job's answer once it has one.
        Asked only while `busy`: otherwise the record is absent, and stays so."""
        answers = []
        if self._orphan is not None:
            self._delete_chunk(txn, self._orphan)
            self._orphan = txn.staged()
        elif self._active is not None or self._waiting:
            job = self._active = self._active or self._waiting.popleft()
            self._touched = job
            reply = apply(job.req)
            if reply is not None:
                answers.append((job.req, reply))
                self._active = None
                self._orphan = txn.staged()  # a failed job's rows; None once a job is whole
        self._uncommitted = txn.staged()
        self._note_busy()
        return answers

    def committed(self) -> None:
        """The step's transaction is on disk."""
        self._committed = self._uncommitted
        self._new, self._touched = [], None

    def forget_new(self) -> None:
        """The step's transaction was rolled back before it worked on a job, to
        run again: the publishes queued in it will be queued again."""
        new = self._new
        self._waiting = deque(j for j in self._waiting if j not in new)
        self._new = []
        self._note_busy()

    def rolled_back(self, error: RequestError) -> list[Answer]:
        """The step's transaction failed: what it did to staging did not happen. The
        job it worked on ends with `error` (its progress in memory is no longer the
        store's); jobs that arrived in it are answered by the step itself."""
        job, new = self._touched, self._new
        answers = [(job.req, p.error_reply(error, job.req.id))] if job is not None and job not in new else []
        self.forget_new()
        self._active = None
        self._orphan = self._uncommitted = self._committed
        self._touched = None
        self._note_busy()
        return answers

    def store_chunk(
        self, txn: Txn, job: Job, topic: TopicConfig, t: int, subs: list[int], stats: TopicStats, max_message_bytes: int
    ) -> bool:
        """Validate and store the job's next chunk, unseen; True once it is whole
        (the record is then cleared and the caller makes it visible)."""
        if topic != job.topic:
            raise Unavailable(f"Topic: topic {topic.name!r} was reconfigured while this publish was being stored; send it again")
        txn.refuse_when_full()
        if job.staged is None and subs:
            job.staged = Staged(t, stats.seq + 1, stats.seq + len(job.messages))
            stats.seq = job.staged.last  # ids of a job that fails are never handed out again
            txn.put_staged(job.staged)
        chunk = job.messages[job.done : job.done + CHUNK_MESSAGES]
        prepared = prepare(topic, chunk, max_message_bytes, job.arrived_ns, job.done)
        if subs:
            assert job.staged is not None, "reserved with its first chunk, above"
            _write(txn, job, topic, t, subs, job.staged.first + job.done, prepared)
        job.done += len(chunk)
        if job.whole and subs:
            txn.put_staged(None)
        return job.whole

    @staticmethod
    def _delete_chunk(txn: Txn, orphan: Staged) -> None:
        """Delete up to CHUNK_MESSAGES rows of an ended job; the record goes with the last."""
        ids = txn.staged_ids(orphan, CHUNK_MESSAGES)
        for holders in txn.pop_holders(orphan.t, ids).values():
            for s, (prio, pos) in holders.items():
                txn.remove_ready(orphan.t, s, prio, pos)
        txn.delete_messages(orphan.t, ids, dedupe=False)  # a Dedupe topic never stages
        if len(ids) < CHUNK_MESSAGES:
            txn.put_staged(None)


def _write(txn: Txn, job: Job, topic: TopicConfig, t: int, subs: list[int], first: int, chunk: list[Prepared]) -> None:
    """A chunk's rows, ids from `first` on, as a publish of them would write
    them, each store write once."""
    ids = range(first, first + len(chunk))
    keys = [b"%d" % m for m in ids]  # generated keys: the message id (PROTOCOL §3 Keys)
    _, prios, expiries, payloads, _, _ = zip(*chunk)  # the chunk's columns, in C
    fragments = list(map(p.message_fragment, keys, payloads, prios, expiries))
    sizes = list(map(len, fragments))
    for prio in prios:
        job.ready[prio] += 1
    job.stored_bytes += sum(sizes)
    txn.put_messages(
        t, first, prios, job.arrived_ns, expiries, keys, fragments, dedupe=False, expire=topic.expire
    )  # a Dedupe topic never stages
    for s in subs:
        txn.push_ready_many(t, s, list(zip(prios, ids, ids)))  # (prio, pos, m): a new message's place is its id
    txn.put_new_holders(t, subs, first, prios)
    if job.event is not None:
        e = job.event
        assert e.prio is not None and e.bytes is not None and e.expires_ns is not None and e.replaced is not None, (
            "a publish has its COLUMNS"
        )
        e.ids += ids
        e.prio += prios
        e.bytes += sizes
        e.expires_ns += expiries
        e.replaced += [False] * len(chunk)
