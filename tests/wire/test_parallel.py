"""Parallel push connections through a real `ppmq serve` (PROTOCOL §9): a
subscriber with `Connections: N` listening on one socket, accepting them all."""

from __future__ import annotations

import socket

import msgspec

from ppmq.client.library import Client
from ppmq.protocol.framing import Framer

from ..conftest import Subscriber, wait_for


class Lanes(Subscriber):
    """A subscriber that records, per connection, the batches it was given, and
    acks them only when told to: on the connection, or through ServerSocket."""

    def __init__(self, path: str, server_socket: str) -> None:
        self.per_connection: dict[socket.socket, list[dict]] = {}
        super().__init__(path, ack=None, server_socket=server_socket)

    @property
    def conns(self) -> list[socket.socket]:
        return list(self._conns)

    def _read(self, conn: socket.socket) -> None:
        framer = Framer(1 << 30)
        with self.lock:
            self.per_connection[conn] = []
        try:
            while data := conn.recv(1 << 16):
                for frame in framer.feed(data):
                    obj = msgspec.json.decode(frame)
                    if "Messages" in obj:
                        with self.lock:
                            self.per_connection[conn].append(obj)
        except OSError:
            pass

    def batches_on(self, i: int) -> list[dict]:
        with self.lock:
            return list(self.per_connection.get(self._conns[i], []))

    def keys(self, i: int) -> list[str]:
        return [m["Key"] for b in self.batches_on(i) for m in b["Messages"]]

    def all_keys(self) -> list[str]:
        return [k for i in range(len(self.conns)) for k in self.keys(i)]

    def ack_on_connection(self, i: int, topic: str, keys: list[str]) -> None:
        frame = {"Topic": topic, "Subscriber": "s", "Acks": keys}
        self.conns[i].sendall(msgspec.json.encode(frame) + b"\n")

    def ack_through_server(self, topic: str, keys: list[str]) -> None:
        with Client(self.server_socket) as c:
            c.ack(topic, "s", keys)


def start(broker_factory, connections: int, window: int, batch: int, topics: list[str] = ("t",)):
    b = broker_factory(
        [{"Name": t, "Subscribers": ["s"]} for t in topics],
        [{"Name": "s", "Connections": connections, "Window": window, "BatchSize": batch}],
    )
    return b, Lanes(b.sub_socket("s"), b.socket)


def publish(b, n: int, topic: str = "t") -> None:
    with b.client() as c:
        c.publish(topic, [{"Payload": i} for i in range(n)])


def settle(b, lanes: Lanes) -> None:
    """Until the broker has acted on what the lanes received: a settled STATUS
    (conftest.BrokerProcess.settled_status), by which every lane that took a
    batch was open for the next one in a step, and every lane's link looked
    whether to open its connection; and what the broker says it pushed is all
    that the lanes received, so the counts the test then checks are final."""
    topics = b.settled_status()["Topics"]
    assert sum(t["Subscribers"]["s"]["Delivered"] for t in topics.values()) == len(lanes.all_keys())


def test_a_backlog_opens_connections_one_by_one_each_up_to_its_window(broker_factory):
    # Given a subscriber of 3 connections with Window 4 that does not ack yet
    b, lanes = start(broker_factory, connections=3, window=4, batch=2)
    try:
        # When a backlog of 20 arrives
        publish(b, 20)
        # Then three connections open, each with exactly a Window in flight
        wait_for(lambda: len(lanes.all_keys()) == 12, what="12 messages over the lanes")
        settle(b, lanes)
        assert len(lanes.conns) == 3
        assert [len(lanes.keys(i)) for i in range(3)] == [4, 4, 4]
        assert all(len(batch["Messages"]) <= 2 for i in range(3) for batch in lanes.batches_on(i))
        assert b.sub_status("t", "s")["InFlight"] == 12
    finally:
        lanes.close()


def test_a_small_backlog_takes_only_the_connections_it_needs_and_batches_go_to_the_least_loaded(broker_factory):
    b, lanes = start(broker_factory, connections=3, window=4, batch=2)
    try:
        # A Window's worth fits the first connection: no second one is opened
        publish(b, 4)
        wait_for(lambda: len(lanes.all_keys()) == 4, what="4 messages")
        settle(b, lanes)
        assert len(lanes.conns) == 1
        # Two more need a second connection; once it is up, batches go where there is room
        publish(b, 6)
        wait_for(lambda: len(lanes.all_keys()) == 10, what="10 messages")
        settle(b, lanes)
        assert len(lanes.conns) == 3 and [len(lanes.keys(i)) for i in range(3)] == [4, 4, 2]
    finally:
        lanes.close()


def test_an_ack_through_the_server_socket_frees_the_connection_that_carried_the_message(broker_factory):
    # Given three connections at their Window of 3 and a backlog behind them
    b, lanes = start(broker_factory, connections=3, window=3, batch=3)
    try:
        publish(b, 15)
        wait_for(lambda: len(lanes.all_keys()) == 9, what="9 messages over the lanes")
        settle(b, lanes)
        assert [len(lanes.keys(i)) for i in range(3)] == [3, 3, 3]
        # When the second connection's messages are acked through ServerSocket
        lanes.ack_through_server("t", lanes.keys(1))
        # Then the next batch goes to the second connection, and only there
        wait_for(lambda: len(lanes.keys(1)) == 6, what="a batch on the freed connection")
        settle(b, lanes)
        assert [len(lanes.keys(i)) for i in range(3)] == [3, 6, 3]
        # And an ack on one connection of what another carried frees the other one
        lanes.ack_on_connection(0, "t", lanes.keys(2))
        wait_for(lambda: len(lanes.keys(2)) == 6, what="a batch on the third connection")
        settle(b, lanes)
        assert [len(lanes.keys(i)) for i in range(3)] == [3, 6, 6]
    finally:
        lanes.close()


def test_a_connection_killed_midway_leaves_its_messages_in_flight_and_the_others_working(broker_factory):
    b, lanes = start(broker_factory, connections=3, window=2, batch=2)
    try:
        publish(b, 30)
        wait_for(lambda: len(lanes.all_keys()) == 6, what="6 messages over the lanes")
        settle(b, lanes)
        # When the middle connection is cut, with its messages unacked
        lost = set(lanes.keys(1))
        lanes.conns[1].shutdown(socket.SHUT_RDWR)
        # Then the others go on taking batches as they ack, until all the rest arrived
        acked: set[str] = set()

        def ack_the_rest() -> bool:
            fresh = [k for k in lanes.all_keys() if k not in lost and k not in acked]
            if fresh:
                lanes.ack_through_server("t", fresh)
                acked.update(fresh)
            return len(acked) == 28

        wait_for(ack_the_rest, what="the other 28 messages")
        # And the cut connection's messages stayed in flight, sent nowhere else
        wait_for(lambda: b.sub_status("t", "s")["Acked"] == 28, what="28 acks")
        assert b.sub_status("t", "s")["InFlight"] == 2
        assert sorted(lanes.all_keys()).count(min(lost)) == 1
        # Until RECONNECT puts them back: then they come again, and the lane is free
        with b.client() as c:
            c.reconnect("s")
        wait_for(lambda: all(lanes.all_keys().count(k) == 2 for k in lost), what="the lost two again")
        lanes.ack_through_server("t", sorted(lost))
        wait_for(lambda: b.sub_status("t", "s")["Acked"] == 30, what="30 acks")
    finally:
        lanes.close()


def test_with_one_connection_the_window_is_as_before_and_one_connection_is_opened(broker_factory):
    b, lanes = start(broker_factory, connections=1, window=4, batch=2)
    try:
        publish(b, 20)
        wait_for(lambda: len(lanes.all_keys()) == 4, what="4 messages")
        settle(b, lanes)
        assert len(lanes.conns) == 1 and len(lanes.all_keys()) == 4
        lanes.ack_through_server("t", lanes.keys(0))
        wait_for(lambda: len(lanes.all_keys()) == 8, what="8 messages")
    finally:
        lanes.close()


def test_each_topic_has_its_own_window_on_each_connection(broker_factory):
    b, lanes = start(broker_factory, connections=2, window=2, batch=2, topics=["a", "b"])
    try:
        publish(b, 10, "a")
        publish(b, 10, "b")
        wait_for(lambda: len(lanes.all_keys()) == 8, what="2 topics x 2 connections x Window 2")
        settle(b, lanes)
        assert len(lanes.conns) == 2
        for i in range(2):
            topics = [batch["Topic"] for batch in lanes.batches_on(i)]
            assert sorted(topics) == ["a", "b"], topics
    finally:
        lanes.close()
