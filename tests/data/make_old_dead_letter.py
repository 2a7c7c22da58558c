"""How tests/data/dead-letter-store.tar.gz was made: by commit be447ed, the last
ppmq whose dead letters' Origin has no `Priority`, run as
`PYTHONPATH=<a checkout of that commit>/src python tests/data/make_old_dead_letter.py OUT`
and packed with `tar -C OUT -czf ... .`.

It leaves one dead letter on topic `dead`: the message `{"n":1}` of priority 1
on topic `jobs`, delivered to subscriber `w` and rejected by it. Kept so that
REDRIVE is tested against an Origin the old code wrote, not one a test imitates.
"""

from __future__ import annotations

import sys

import msgspec

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.protocol import messages as p
from ppmq.store.store import Store

NOW = 1_800_000_000 * 10**9


def fixture_config(out: str) -> Config:
    """The config the store was written with: `dead` has the priorities of `jobs`,
    so the copy keeps the priority that REDRIVE falls back to."""
    return Config(
        server_socket="/nonexistent",
        data_path=out,
        sync=True,
        subscribers=[SubscriberConfig(name=n, socket=f"/nonexistent/{n}") for n in ("w", "archive")],
        topics=[
            TopicConfig(name="jobs", subscribers=["w"], priorities=2, dead_letter="dead"),
            TopicConfig(name="dead", subscribers=["archive"], priorities=2),
        ],
    )


def main(out: str) -> None:
    store = Store(out, sync=True, max_bytes=1 << 26)
    broker = Broker(fixture_config(out), store, NOW)
    broker.step([p.Request(topic="jobs", messages=[p.Message(payload=msgspec.Raw(b'{"n":1}'), priority=1)])], set(), NOW)
    (batch,) = broker.step([], {"w"}, NOW + 10**9).deliveries
    broker.step([p.Request(topic="jobs", subscriber="w", rejects=[str(m) for m in batch.msgs])], set(), NOW + 2 * 10**9)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
