"""The config in force, and the ground the broker's parts share.

A Broker is put together from mixins: publishing (publishing.py), completion
(completion.py) and filling subscribers (filling.py), over this base. They are
parts of one object rather than collaborators because a failed request, step or
reload puts back the wiring by replacing it whole (`_rewire`), and the counters
of each topic it touched (ledger.py): a collaborator holding its own reference
would go on with the discarded value. Here each part reads them through the one broker, and the
declarations below say what every part may rely on. The parts also call one
another through it: a limit that drops a message, or an expiry met while
filling, is completion's; a dead-letter copy is a publish.
"""

from __future__ import annotations

from typing import NamedTuple

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.access import Rules
from ppmq.core.events import StepEvents
from ppmq.core.taker_holdings import Owners
from ppmq.protocol import messages as p
from ppmq.store.state import State
from ppmq.store.store import Store


class Wiring(NamedTuple):
    """What the broker derives from its config: switched as one value by a reload,
    and switched back whole if that reload's commit fails."""

    config: Config
    topics: dict[str, TopicConfig]
    sub_configs: dict[str, SubscriberConfig]
    sub_topics: dict[str, list[TopicConfig]]  # subscriber -> the topics it takes
    topic_by_id: dict[int, str]
    sub_by_id: dict[int, str]
    rules: Rules | None  # the access rules of config
    topic_order: dict[str, int]  # topic -> its place in the config: the order subscribers are filled in

    @classmethod
    def of(cls, config: Config, state: State) -> Wiring:
        return cls(
            config,
            {t.name: t for t in config.topics},
            {s.name: s for s in config.subscribers},
            {s.name: [t for t in config.topics if s.name in t.subscribers] for s in config.subscribers},
            {i: n for n, i in state.topic_ids.items()},
            {i: n for n, i in state.sub_ids.items()},
            Rules(config),
            {t.name: i for i, t in enumerate(config.topics)},
        )


class Wired:
    """What the parts of a Broker share: the store, the counters, the step's
    journal events, and the config in force, read through one Wiring."""

    store: Store
    state: State  # a topic's counters are replaced when a request or a step that touched them is undone
    _wiring: Wiring | None
    _events: StepEvents
    _owners: Owners  # who took which message of a Pull subscriber (taking.py)

    @property
    def config(self) -> Config:
        return self._wiring.config

    @property
    def topics(self) -> dict[str, TopicConfig]:
        return self._wiring.topics if self._wiring is not None else {}

    @property
    def sub_configs(self) -> dict[str, SubscriberConfig]:
        return self._wiring.sub_configs

    @property
    def sub_topics(self) -> dict[str, list[TopicConfig]]:
        return self._wiring.sub_topics

    @property
    def _topic_order(self) -> dict[str, int]:
        return self._wiring.topic_order

    @property
    def _topic_by_id(self) -> dict[int, str]:
        return self._wiring.topic_by_id

    @property
    def _sub_by_id(self) -> dict[int, str]:
        return self._wiring.sub_by_id

    # --- names in requests, looked up in the config in force ------------------------------

    def _topic_for(self, req: p.Request, field: str) -> TopicConfig:
        if req.topic is None:
            raise p.BadRequest(f"Topic: required with {field}")
        topic = self.topics.get(req.topic)
        if topic is None:
            raise p.NotFound(f"Topic: unknown topic {req.topic!r}")
        return topic

    def _subscriber_of(self, name: str | None, topic: TopicConfig, field: str) -> str:
        if name is None:
            raise p.BadRequest(f"Subscriber: required with {field}")
        if name not in self.sub_topics:
            raise p.NotFound(f"Subscriber: unknown subscriber {name!r}")
        if name not in topic.subscribers:
            raise p.NotFound(f"Subscriber: {name!r} is not subscribed to topic {topic.name!r}")
        return name

    def _topics_of_subscriber(self, req: p.Request, command: str) -> list[TopicConfig]:
        """The topics a RECONNECT, PAUSE or RESUME names: its Topic, or all of its subscriber's."""
        if req.subscriber is None:
            raise p.BadRequest(f"Subscriber: required with {command}")
        if req.subscriber not in self.sub_topics:
            raise p.NotFound(f"Subscriber: unknown subscriber {req.subscriber!r}")
        if req.topic is None:
            return self.sub_topics[req.subscriber]
        topic = self._topic_for(req, command)
        self._subscriber_of(req.subscriber, topic, command)
        return [topic]
