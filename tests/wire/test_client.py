"""The client library, both flavours, against a real broker."""

from __future__ import annotations

import asyncio

import pytest

from ppmq.client import AsyncClient, Client, Status
from ppmq.errors import ClientError


def test_the_asyncio_client_publishes_acks_reconnects_and_reads_status(broker_factory):
    b = broker_factory([{"Name": "t", "Priorities": 2, "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)

    async def scenario() -> Status:
        async with await AsyncClient.connect(b.socket) as c:
            # concurrent requests on one connection each get their own reply
            results = await asyncio.gather(*(c.publish("t", [{"Payload": i, "Priority": 1}]) for i in range(5)))
            assert [r.accepted for r in results] == [1] * 5
            keys = [m["Key"] for m in await asyncio.to_thread(sub.wait_messages, 5)]
            assert (await c.ack("t", "s", keys[:2])).accepted == 2
            await c.reconnect("s", "t")
            await asyncio.to_thread(sub.wait_messages, 8)
            with pytest.raises(ClientError) as err:
                await c.publish("t", [{"Payload": 1, "Priority": 2}])
            assert err.value.status == 400 and "Messages[0].Priority" in err.value.error
            return await c.status()

    s = asyncio.run(scenario()).topics["t"].subscribers["s"]
    assert (s.acked, s.in_flight, s.redelivered) == (2, 3, 3)
    assert sorted(sub.payloads()[5:]) == [2, 3, 4]


def test_the_blocking_client_raises_client_error_with_the_brokers_status(broker_factory):
    b = broker_factory([{"Name": "t", "Dedupe": True, "Subscribers": ["s"]}], ["s"])
    with b.client() as c:
        with pytest.raises(ClientError) as err:
            c.publish("t", [{"Payload": 1}])
        assert err.value.status == 400 and err.value.error == "Messages[0].Key: required on topic 't', which has Dedupe"
        with pytest.raises(ClientError) as err:
            c.ack("t", "nobody", ["k"])
        assert err.value.status == 404
        assert c.publish("t", [{"Payload": 1, "Key": "k"}]).accepted == 1  # the connection is still good


@pytest.mark.parametrize("connect", [lambda p: Client(p), lambda p: asyncio.run(AsyncClient.connect(p))])
def test_a_client_that_cannot_reach_the_broker_says_so(short_tmp, connect):
    with pytest.raises(ClientError, match="cannot connect to .*No such file"):
        connect(str(short_tmp / "missing.sock"))
