"""How the stores in tests/data were made, each by the last ppmq to write its
schema: schema1-store.tar.gz by commit 182c8ab, schema2-store.tar.gz by commit
95916a6, schema3-store.tar.gz by commit ac60ea3, schema4-store.tar.gz by commit
960dbc3, schema5-store.tar.gz by commit be447ed, run as `PYTHONPATH=<a checkout of that commit>/src python
tests/data/make_old_store.py OUT` and packed with `tar -C OUT -czf ... .`.
schema4-full-store.tar.gz was made by commit 960dbc3 too, with `--full`.

It leaves, on topic `jobs` (subscribers a and b, AckRetry 1h, so deadlines are
indexed) and the Dedupe topic `latest` (subscriber a): messages acked by one
subscriber and in flight to the other, messages in flight to both, messages
ready for both, and one that expires. Kept so that the migration is tested
against a store the old code wrote, not one a test imitates.

With `--full` it leaves instead a store at its MaxStoreBytes (FULL_MAX_BYTES):
messages of FULL_PAYLOAD_BYTES on topic `bulk` (subscriber a, some in flight),
published until the broker refused one for want of room (507). Converting its
bodies in one transaction needs about twice their space, more than the map
that MaxStoreBytes gives.
"""

from __future__ import annotations

import sys

import msgspec

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.protocol import messages as p
from ppmq.store.store import Store

NOW = 1_800_000_000 * 10**9
FULL_MAX_BYTES = 64 << 20  # MaxStoreBytes of the full store
FULL_PAYLOAD_BYTES = 100_000


def fixture_config(out: str) -> Config:
    """The config the store was written with."""
    return Config(
        server_socket="/nonexistent",
        data_path=out,
        sync=True,
        subscribers=[SubscriberConfig(name=n, socket=f"/nonexistent/{n}", batch_size=3) for n in ("a", "b")],
        topics=[
            TopicConfig(name="jobs", subscribers=["a", "b"], ack_retry=3600.0, priorities=2, expire=True),
            TopicConfig(name="latest", subscribers=["a"], dedupe=True),
        ],
    )


def main(out: str) -> None:
    config = fixture_config(out)
    store = Store(out, sync=True, max_bytes=1 << 26)
    broker = Broker(config, store, NOW)
    msgs = [p.Message(payload=msgspec.Raw(b'{"n":%d}' % i), priority=i % 2, ttl_s=7200.0 if i == 8 else None) for i in range(9)]
    keyed = [p.Message(key=k, payload=msgspec.Raw(b'"%s"' % k.encode())) for k in ("x", "y")]
    broker.step([p.Request(topic="jobs", messages=msgs), p.Request(topic="latest", messages=keyed)], set(), NOW)
    first = broker.step([], {"a", "b"}, NOW + 10**9).deliveries  # a batch of 3 to each, and one of `latest` to a
    a_jobs = next(d for d in first if d.subscriber == "a" and d.topic == "jobs")
    broker.step([p.Request(topic="jobs", subscriber="a", acks=[str(m) for m in a_jobs.msgs[:2]])], set(), NOW + 2 * 10**9)
    store.close()


def full_config(out: str) -> Config:
    """The config the full store was written with."""
    return Config(
        server_socket="/nonexistent",
        data_path=out,
        sync=False,
        max_store_bytes=FULL_MAX_BYTES,
        subscribers=[SubscriberConfig(name="a", socket="/nonexistent/a", batch_size=5)],
        topics=[TopicConfig(name="bulk", subscribers=["a"])],
    )


def full_payload(n: int) -> bytes:
    """The JSON payload of the full store's message n (from 0)."""
    return b'"%d:%s"' % (n, b"x" * (FULL_PAYLOAD_BYTES - 10))


def main_full(out: str) -> None:
    config = full_config(out)
    store = Store(out, sync=False, max_bytes=FULL_MAX_BYTES)
    broker = Broker(config, store, NOW)
    n = 0
    while True:
        msgs = [p.Message(payload=msgspec.Raw(full_payload(n + i))) for i in range(10)]
        (reply,) = broker.step([p.Request(topic="bulk", messages=msgs)], set(), NOW).replies
        if reply.status == 507:
            break
        n += len(msgs)
    broker.step([], {"a"}, NOW + 10**9)  # a batch in flight to a
    print(f"{n} messages")
    store.close()


if __name__ == "__main__":
    if sys.argv[1] == "--full":
        main_full(sys.argv[2])
    else:
        main(sys.argv[1])
