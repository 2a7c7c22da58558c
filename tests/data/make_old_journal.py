"""How tests/data/journal-v1.jsonl.gz was made: by commit ac60ea3, the last ppmq
to write journal format 1, run as `PYTHONPATH=<a checkout of that commit>/src
python tests/data/make_old_journal.py OUT`, its one segment then copied here.

The broker's state machine, on a store under OUT, with the clock passed in and
the real Journal of that commit (host `upgraded`): ten messages are published
to topic `orders` while its subscriber `a` is open, so they are delivered in
the same step, and `a` acks the first five half a second later. The other five
are still in flight when the broker stops; tests/pipeline/test_versions.py acks
them in format 2, as the upgraded broker would. Kept so that `ppmq report` is
tested on a segment the old code wrote, not one a test imitates.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.protocol import messages as p
from ppmq.server.journal import Journal
from ppmq.store.store import Store

NS = 1_000_000_000
NOW = 1_800_000_000 * NS  # the publish
ACKED_AFTER_NS = NS // 2  # the first five acks
HOST = "upgraded"


def main(out: str) -> None:
    config = Config(
        server_socket="/nonexistent", data_path=out, sync=False,
        subscribers=[SubscriberConfig(name="a", socket="/nonexistent/a", batch_size=10)],
        topics=[TopicConfig(name="orders", subscribers=["a"])],
    )  # fmt: skip
    store = Store(out, sync=False, max_bytes=1 << 30)
    broker = Broker(config, store, NOW)
    journal = Journal(Path(out, "journal"), 1 << 20, 1 << 30, host=HOST).start()
    messages = [p.Message(payload=msgspec.Raw(b"%d" % i)) for i in range(10)]
    step = broker.step([p.Request(topic="orders", messages=messages, id=msgspec.Raw(b"1"))], {"a"}, NOW)
    journal.put(step.events)
    keys = [m["Key"] for m in msgspec.json.decode(step.deliveries[0].frame)["Messages"]]
    journal.put(broker.step([p.Request(topic="orders", subscriber="a", acks=keys[:5])], set(), NOW + ACKED_AFTER_NS).events)
    journal.close()
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
