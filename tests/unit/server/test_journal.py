"""The journal file layer on its own: format, rotation, gzip, the size bound, losses."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from ppmq.core import events as ev
from ppmq.core.events import Event
from ppmq.server.journal import QUEUE_STEPS, Journal
from ppmq.server.journal_lines import VERSION, Lines
from tests.conftest import wait_for


def deliveries(first: int, n: int) -> list[Event]:
    """One deliver event of n messages with ids first.., as a step would emit it."""
    ids = list(range(first, first + n))
    return [Event(event=ev.DELIVER, ts=1_000 + first, topic="t", subscriber="s", ids=ids, pub_ns=ids, attempts=[1] * n, bytes=[10] * n)]


def records(directory: Path) -> list[dict]:
    """Every record of every segment, oldest segment first."""
    out = []
    for path in sorted(directory.iterdir()):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            out += [json.loads(line) for line in f]
    return out


def test_a_record_is_the_event_with_version_and_host_in_front(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 1 << 20, 1 << 30, host="h1").start()
    journal.put(deliveries(5, 2))
    journal.close()
    [path] = tmp_path.iterdir()
    assert path.name.endswith(".jsonl.gz")
    line = gzip.decompress(path.read_bytes()).decode()
    assert line == (
        '{"V":2,"Host":"h1","Event":"deliver","Ts":1005,"Topic":"t","Subscriber":"s",'
        '"Ids":[5,6],"PubNs":[5,6],"Attempts":[1],"Bytes":[10]}\n'
    )
    assert VERSION == 2


def test_a_column_whose_entries_are_all_equal_is_written_once() -> None:
    """Given a publish of three messages that share priority, expiry and Replaced but
    not their sizes, then those three columns have one entry and Bytes three; a
    record of one message is written as it is."""
    publish = Event(
        event=ev.PUBLISH, ts=1, topic="t", ids=[7, 8, 9], prio=[2] * 3, bytes=[10, 11, 10], expires_ns=[0] * 3, replaced=[False] * 3
    )
    single = Event(event=ev.DELIVER, ts=2, topic="t", subscriber="s", ids=[7], pub_ns=[1], attempts=[1], bytes=[10])
    first, second = map(json.loads, Lines("h").encode([publish, single]).splitlines())
    assert {k: first[k] for k in ("Ids", "Prio", "Bytes", "ExpiresNs", "Replaced")} == {
        "Ids": [7, 8, 9], "Prio": [2], "Bytes": [10, 11, 10], "ExpiresNs": [0], "Replaced": [False],
    }  # fmt: skip
    assert (second["V"], second["Host"], second["PubNs"], second["Attempts"], second["Bytes"]) == (2, "h", [1], [1], [10])


def test_columns_given_as_one_value_stay_one_until_a_batch_differs() -> None:
    """Batches delivered in one step share one record: fresh ones give their publish
    time and attempt as one value, and the record keeps one entry while they agree.
    A redelivered batch among them spells the column out, every message in its place."""
    events = ev.StepEvents(journaled=True, now_ns=5)
    events.deliver("t", "s", [1, 2], 5, 1, [10, 10])
    events.deliver("t", "s", [3], 5, 1, [10])
    (same,) = events.take()
    events.deliver("t", "s", [1, 2], 5, 1, [10, 10])
    events.deliver("t", "s", [9], 6, 1, [10])
    events.deliver("t", "s", [7, 8], [3, 4], [2, 3], [10, 10])
    (mixed,) = events.take()
    events.publish("t", [7], [0], [10], [0], False)
    events.publish("t", [8], [0], [10], [0], [True])
    (publish,) = events.take()
    assert (same.ids, same.pub_ns, same.attempts) == ([1, 2, 3], [5], [1])
    assert (mixed.ids, mixed.pub_ns, mixed.attempts) == ([1, 2, 9, 7, 8], [5, 5, 6, 3, 4], [1, 1, 1, 2, 3])
    assert (publish.ids, publish.replaced) == ([7, 8], [False, True])
    line = json.loads(Lines("h").encode([same]))
    assert (line["Ids"], line["PubNs"], line["Attempts"], line["Bytes"]) == ([1, 2, 3], [5], [1], [10])


def test_an_ack_record_has_its_ids_only() -> None:
    """The broker's state machine reports an ack with its ids; the publish time and
    attempt are the report's to find (docs/journal.md)."""
    events = ev.StepEvents(journaled=True, now_ns=5)
    given = [3, 4]
    events.ack("t", "s", None, given)
    events.ack("t", "s", "AutoAck", [5])
    events.ack("t", "s", None, [6])  # joins the first: same kind, topic, subscriber and reason
    lines = [json.loads(line) for line in Lines("h").encode(events.take()).splitlines()]
    assert given == [3, 4]  # the event's ids are its own list, not the caller's
    assert lines == [
        {"V": 2, "Host": "h", "Event": "ack", "Ts": 5, "Topic": "t", "Subscriber": "s", "Ids": [3, 4, 6]},
        {"V": 2, "Host": "h", "Event": "ack", "Ts": 5, "Topic": "t", "Subscriber": "s", "Reason": "AutoAck", "Ids": [5]},
    ]


def test_segments_rotate_at_segment_bytes_and_keep_every_record_in_order(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 2_000, 1 << 30).start()
    for i in range(100):
        journal.put(deliveries(i * 10, 10))
    journal.close()
    segments = sorted(tmp_path.iterdir())
    assert len(segments) > 5
    assert all(p.name.endswith(".jsonl.gz") for p in segments)
    ids = [m for r in records(tmp_path) for m in r["Ids"]]
    assert ids == list(range(1000))


def test_a_step_that_fills_a_segment_is_cut_at_the_end_of_the_line_that_fills_it(tmp_path: Path) -> None:
    """One step of 30 records, 20 records' worth of segment: the first segment ends
    with the line that reaches the size, the rest go to the next one."""
    one = len(Lines("h").encode(deliveries(0, 1)))
    journal = Journal(tmp_path, 20 * one - one // 2, 1 << 30, host="h").start()
    journal.put([e for i in range(30) for e in deliveries(i, 1)])
    journal.close()
    first, second = sorted(tmp_path.iterdir())
    assert len(gzip.decompress(first.read_bytes()).splitlines()) == 20
    assert [m for r in records(tmp_path) for m in r["Ids"]] == list(range(30))


def test_the_oldest_segments_go_first_to_stay_under_max_bytes(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 1_000, 3_000).start()
    for i in range(300):
        journal.put(deliveries(i * 10, 10))
    journal.close()
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 3_000
    ids = [m for r in records(tmp_path) for m in r["Ids"]]
    assert ids[-1] == 2999, "the newest records are kept"
    assert ids == list(range(ids[0], 3000)), "what is kept is one unbroken tail"
    assert ids[0] > 0


def test_a_segment_left_open_by_a_killed_broker_is_gzipped_at_start(tmp_path: Path) -> None:
    leftover = tmp_path / "journal-20260101T000000000000000Z.jsonl"
    leftover.write_text('{"V":1,"Host":"h","Event":"ack","Ts":1}\n{"V":1,"Host":"h","Ev')  # cut mid-record
    Journal(tmp_path, 1 << 20, 1 << 30).start().close()
    assert [p.name for p in tmp_path.iterdir()] == [leftover.name + ".gz"]
    assert gzip.decompress((tmp_path / (leftover.name + ".gz")).read_bytes()).startswith(b'{"V":1,"Host":"h","Event":"ack"')


def test_a_full_queue_drops_events_and_says_how_many(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 1 << 20, 1 << 30)
    for i in range(QUEUE_STEPS + 3):  # the thread is not running yet: nothing is taken off
        journal.put(deliveries(i, 1))
    assert journal.dropped_queue == 3
    journal.start().close()
    recs = records(tmp_path)
    assert len([r for r in recs if r["Event"] == "deliver"]) == QUEUE_STEPS
    assert [r["Count"] for r in recs if r["Event"] == "dropped"] == [3]


def test_a_segment_whose_directory_went_away_while_it_was_gzipped_costs_the_journal_thread_nothing(tmp_path: Path, caplog) -> None:
    # Given a closed segment whose directory was replaced by a file meanwhile
    replaced = tmp_path / "journal"
    replaced.write_text("not a directory")
    # When the journal thread gzips it, Then it logs and returns: an exception here
    # would end the thread, and with it every journal record after
    Journal._compress(replaced / "journal-20261125T000000000000000Z.jsonl")
    assert "cannot gzip" in caplog.text


def test_a_disk_that_fails_costs_counted_events_and_writing_resumes(tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    journal = Journal(directory, 1, 1 << 30).start()  # every write closes its segment
    journal.put(deliveries(0, 1))
    wait_for(lambda: list(directory.glob("*.gz")), what="the first segment")
    saved = tmp_path / "saved"
    directory.rename(saved)
    directory.write_text("not a directory")  # opening the next segment fails
    journal.put(deliveries(1, 1))
    wait_for(lambda: journal.dropped_io >= 1, what="a failed write")
    directory.unlink()
    directory.mkdir()
    journal.put(deliveries(2, 1))
    journal.close()
    shutil.copytree(saved, directory, dirs_exist_ok=True)
    recs = records(directory)
    assert [r["Ids"] for r in recs if r["Event"] == "deliver"] == [[0], [2]]
    assert [r["Count"] for r in recs if r["Event"] == "dropped"] == [1]
