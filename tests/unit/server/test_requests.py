"""A connection's requests on a real Unix socket pair, a real writer and a real store."""

from __future__ import annotations

import asyncio
import socket

import msgspec

from ppmq.server.connection import Connection, ReplyChannel
from ppmq.server.group_commit import GroupCommit
from ppmq.server.requests import Requests
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
