"""The journal events of the state machine, on a fake clock: what a step reports,
and what a rejected request must not report."""

from __future__ import annotations

import msgspec

from ppmq.protocol import messages as p
from ppmq.store.state import NS

from .test_broker import NOW, open_broker


def message(payload: bytes, **fields: object) -> p.Message:
    return p.Message(payload=msgspec.Raw(payload), **fields)


def test_a_request_that_fails_after_its_publish_reports_nothing_but_its_rejection(tmp_path):
    # Given a request whose messages are fine but whose command is not
    broker, store = open_broker(tmp_path)
    bad = p.Request(topic="t", messages=[message(b"1")], command="FLY", id=msgspec.Raw(b"1"))
    # When it is applied
    step = broker.step([bad], set(), NOW)
    # Then the publish is undone, and the only event is the rejection with its reply's status
    assert step.replies[0].status == 400
    assert [(e.event, e.topic, e.status, e.count) for e in step.events] == [("reject", "t", 400, 1)]
    store.close()


def test_events_carry_the_step_time_and_each_message_once(tmp_path):
    # Given two publishes in one step while s is open, and an AckRetry of 5 s
    broker, store = open_broker(tmp_path, ack_retry=5.0)
    step = broker.step([p.Request(topic="t", messages=[message(b"%d" % i) for i in range(3)]) for _ in range(2)], {"s"}, NOW)
    publishes = [e for e in step.events if e.event == "publish"]
    (deliver,) = [e for e in step.events if e.event == "deliver"]
    # Then each request has its publish event, and one batch delivers all six, fresh:
    # their publish time and attempt are one value for all six, as the journal writes them
    assert [e.ids for e in publishes] == [[1, 2, 3], [4, 5, 6]]
    assert {e.ts for e in step.events} == {NOW}
    assert (deliver.ids, deliver.pub_ns, deliver.attempts) == ([1, 2, 3, 4, 5, 6], [NOW], [1])
    # When nobody acks within AckRetry, they are given back and pushed again
    later = NOW + 6 * NS
    step = broker.step([], {"s"}, later)
    kinds = {e.event: e for e in step.events}
    assert (kinds["requeue"].reason, kinds["requeue"].ids) == ("AckRetry", [1, 2, 3, 4, 5, 6])
    assert (kinds["deliver"].attempts, kinds["deliver"].pub_ns) == ([2] * 6, [NOW] * 6)
    # And an ack reports the id it acknowledged, and no more: the publish is the report's to find
    step = broker.step([p.Request(topic="t", subscriber="s", acks=["2", "9"])], set(), later + NS)
    (ack,) = step.events
    assert (ack.event, ack.ids, ack.pub_ns, ack.attempts, ack.ts) == ("ack", [2], None, None, later + NS)
    store.close()


def test_a_step_with_nothing_to_report_reports_nothing(tmp_path):
    broker, store = open_broker(tmp_path)
    assert broker.step([], {"s"}, NOW).events == []
    store.close()


def test_delivery_control_reports_nacks_rejects_touches_purges_and_pauses(tmp_path):
    # Given three messages in flight to s, with an AckRetry
    broker, store = open_broker(tmp_path, ack_retry=5.0)
    broker.step([p.Request(topic="t", messages=[message(b"%d" % i) for i in range(4)])], {"s"}, NOW)
    # When s nacks one with a delay, rejects one and touches one; and the operator purges the last and pauses s
    control = p.Request(topic="t", subscriber="s", nacks=["1"], delay=2.5, rejects=["2"], touch=["3", "9"])
    step = broker.step(
        [control, p.Request(command="PURGE", topic="t", keys=["4"]), p.Request(command="PAUSE", subscriber="s")], set(), NOW + NS
    )
    kinds = {e.event: e for e in step.events}
    # Then each is journaled with the messages it concerned
    assert (kinds["nack"].ids, kinds["nack"].attempts, kinds["nack"].pub_ns, kinds["nack"].delay_ns) == ([1], [1], [NOW], int(2.5 * NS))
    assert (kinds["rejected"].ids, kinds["rejected"].attempts) == ([2], [1])
    assert kinds["touch"].ids == [3]
    assert (kinds["purge"].ids, kinds["purge"].delivered) == ([4], [True])
    assert (kinds["pause"].topic, kinds["pause"].subscriber, kinds["pause"].ids) == ("t", "s", [])
    assert step.replies[0].accepted == 3
    store.close()
