"""An unchanged ppMQ producer, subscriber and config work (PROTOCOL §1, §2).

The frames here are byte for byte what ppMQ's Go code writes with
encoding/json: lower-case wrapper keys, Go's zero time for "no expiry",
Priority omitted when 0, one object per connection, no Id and so no reply.
"""

from __future__ import annotations

import socket

from ..conftest import BrokerProcess, Subscriber, wait_for

PPMQ_CONFIG = """\
ServerSocket: {dir}/mq.sock
DataPath: {dir}/store
Subscribers:
  - Name: iptables-ips
    Socket: {dir}/iptables-ips.sock
  - Name: sharedmem-ips
    Socket: {dir}/pam-ips.sock
Topics:
  - Name: ips
    AckRetry: 0
    Dedupe: False
    Priorities: 1
    Expire: True
    Subscribers:
      - iptables-ips
      - sharedmem-ips
"""


def send_one_way(path: str, frame: bytes) -> None:
    """What ppMQ's producer does: dial, encode one wrapper, hang up."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(frame)
    s.close()


def test_a_ppmq_producer_subscriber_and_config_work_unchanged(short_tmp):
    # Given ppMQ's own config file, unchanged but for the directory
    b = BrokerProcess(short_tmp, PPMQ_CONFIG.format(dir=short_tmp)).start()
    try:
        subs = [Subscriber(f"{short_tmp}/iptables-ips.sock", ack=None), Subscriber(f"{short_tmp}/pam-ips.sock", ack=None)]
        # When ppMQ's producer sends its wrapper and hangs up
        send_one_way(
            b.socket,
            b'{"topic":"ips","messages":[{"Key":"192.168.86.1","Payload":"Some Payload","Expires":"0001-01-01T00:00:00Z"},'
            b'{"Key":"192.168.86.2","Payload":"Some Payload 2","Expires":"0001-01-01T00:00:00Z"},'
            b'{"Payload":"Some Payload 3","Expires":"0001-01-01T00:00:00Z"}]}\n',
        )
        # Then both subscribers get all three (keys generated: ips has no Dedupe), no Expires
        for sub in subs:
            got = sub.wait_messages(3)
            assert [m["Payload"] for m in got] == ["Some Payload", "Some Payload 2", "Some Payload 3"]
            assert all("Expires" not in m for m in got)
        # And ppMQ's subscriber acks and CONNECTs through the server socket, one-way
        keys = [m["Key"] for m in subs[0].messages]
        send_one_way(b.socket, b'{"topic":"ips","subscriber":"iptables-ips","acks":["%s"]}\n' % keys[0].encode())
        wait_for(lambda: b.sub_status("ips", "iptables-ips")["Acked"] == 1, what="the one-way ack")
        send_one_way(b.socket, b'{"subscriber":"iptables-ips","command":"CONNECT"}\n')
        subs[0].wait_messages(5)
        assert [m["Payload"] for m in subs[0].messages[3:]] == ["Some Payload 2", "Some Payload 3"]
        # A bad one-way wrapper is counted, not answered, and breaks nothing
        send_one_way(b.socket, b'{"topic":"nope","messages":[{"Payload":"x"}]}\n')
        wait_for(lambda: b.status()["Rejected"] == 1, what="the rejected one-way wrapper to be counted")
        assert "request without Id rejected (404)" in b.log
    finally:
        for sub in subs:
            sub.close()
        b.stop()
