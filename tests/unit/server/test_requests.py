"""A connection's requests on a real Unix socket pair, a real writer and a real store."""

from __future__ import annotations

import asyncio
import socket

import msgspec
import pytest
from msgspec import UNSET

from ppmq.core.ops import Invalid
from ppmq.protocol.framing import Framer
from ppmq.server.connection import Connection, ReplyChannel
from ppmq.server.group_commit import GroupCommit
from ppmq.server.requests import Requests, _decode
from tests.unit.core.test_broker import open_broker


def test_what_arrives_before_the_requests_listen_is_kept_and_answered_in_order(tmp_path):
    # Given a connection whose peer sends two publishes before anything reads them
    broker, store = open_broker(tmp_path)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.sendall(b'{"Id":1,"Topic":"t","Messages":[{"Payload":"a"}]}\n{"Id":2,"Topic":"t","Messages":[{"Payload":"b"}]}\n')

    async def run() -> list[dict]:
        loop = asyncio.get_running_loop()
        writer = GroupCommit(broker, durable=False)
        stepping = asyncio.create_task(writer.run())
        _, conn = await loop.connect_accepted_socket(Connection, ours)
        await asyncio.sleep(0.05)  # read, and kept: nothing listens yet
        # When its requests begin to listen, and the peer then closes its side
        serving = asyncio.create_task(Requests(conn, ReplyChannel(conn, "peer"), writer, 1 << 20).serve())
        theirs.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(serving, timeout=10)
        writer.stop()
        await stepping
        theirs.settimeout(10)
        replies = b""
        while chunk := await loop.run_in_executor(None, theirs.recv, 1 << 16):
            replies += chunk
        return [msgspec.json.decode(line) for line in replies.splitlines()]

    # Then both are answered, in the order they were sent, and the connection closes
    replies = asyncio.run(run())
    assert [(r["Id"], r["Status"]) for r in replies] == [(1, 200), (2, 200)]
    theirs.close()
    store.close()


class _Transport:
    def pause_reading(self) -> None:
        pass


class _Peer:
    """What Requests and its ReplyChannel use of a Connection, with nothing unsent."""

    transport = _Transport()

    def unsent(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False


class _Ops:
    """A writer that keeps what it is handed, with each request's frame size."""

    def __init__(self, channel: ReplyChannel) -> None:
        self.channel = channel
        self.ops: list[tuple[object, int]] = []
        self._counted = 0

    def submit(self, op: object, sink: object = None) -> None:
        self.ops.append((_shown(op), self.channel.outstanding_bytes - self._counted))
        self._counted = self.channel.outstanding_bytes


def _shown(op: object) -> object:
    """An op as a value to compare: a request as its JSON, an error by its class and text."""
    if isinstance(op, Invalid):
        return type(op.error).__name__, str(op.error), op.id if op.id is UNSET else bytes(op.id)
    return msgspec.json.encode(op)


LIMIT = 200
READS = [
    b'{"Topic":"t","Messages":[{"Payload":"a"}],"Id":1}\n',
    b'{"Topic":"t","Subscriber":"s","Acks":["1"]}\n',
    b'{"topic":"t","subscriber":"s","acks":["1"],"id":"x"}\n',  # keys as Go writes them
    '{"Topic":"t","Messages":[{"Payload":"\u00e9"}],"Id":"\u00e9"}\n'.encode(),
    b'{"Topic":"t","Messages":[{"Payload":"\xff"}],"Id":2}\n',  # not UTF-8
    b'{"Topic":"a","Acks":["1"]}{"Topic":"b","Acks":["2"]}\n',  # two values on one line
    b'{"Topic":"a","Acks":["1"]}\n{"Topic":"b","Acks":["2"]}\n',  # two lines in one read
    b'{\n  "Topic": "t",\n  "Acks": ["1"]\n}\n',  # pretty-printed
    b'{"Topic":"t","Acks":["1"]}\r\n',
    b'{"Topic":"t","Acks":["1"]} \n',
    b'{"Topic":"t","Id":[1]}\n',  # an Id that is not a string or a number
    b'{"Topic":5,"Id":3}\n',
    b'{"Topic":"t","Bogus":1,"Id":4}\n',
    b"{not json}\n",
    b'{"Topic":"t","Messages":[{"Payload":"%s"}]}\n' % (b"x" * (LIMIT - 38)),  # exactly the limit
    b'{"Topic":"t","Messages":[{"Payload":"%s"}]}\n' % (b"x" * (LIMIT - 37)),  # one byte over it
]


@pytest.mark.parametrize("read", READS)
def test_a_read_handed_over_whole_gives_the_ops_and_sizes_the_framer_and_decoder_give(read):
    # Given the requests of a connection, and the framer and decoder alone beside them
    channel = ReplyChannel(_Peer(), "peer")  # type: ignore[arg-type]
    writer = _Ops(channel)
    requests = Requests(_Peer(), channel, writer, LIMIT)  # type: ignore[arg-type]
    expected = [(_shown(_decode(frame, None)), len(frame)) for frame in Framer(LIMIT).feed(read)]
    # When the read arrives
    requests.feed(read)
    # Then the writer is handed the same ops, counted at the same sizes
    assert writer.ops == expected


class _NoFramer(Framer):
    def feed(self, data: bytes) -> list[bytes]:
        raise AssertionError("framed")


@pytest.mark.parametrize("read", READS[:4])
def test_a_read_of_one_whole_request_is_not_framed(read):
    channel = ReplyChannel(_Peer(), "peer")  # type: ignore[arg-type]
    writer = _Ops(channel)
    requests = Requests(_Peer(), channel, writer, LIMIT)  # type: ignore[arg-type]
    requests.framer = _NoFramer(LIMIT)
    requests.feed(read)
    assert len(writer.ops) == 1
