"""The config in force, as the broker's parts look it up (PROTOCOL §6).

One `Topology` object lives as long as the broker, and every part holds it: a
reload installs a new config into it, and a request, step or reload that is
undone restores what it held before (`snapshot`, `restore`). Its fields are
plain attributes, read without a call on every message.
"""

from __future__ import annotations

from typing import Any

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.access import Rules
from ppmq.errors import BadRequest, NotFound
from ppmq.protocol import messages as p
from ppmq.store.state import State

Snapshot = dict[str, Any]


class Topology:
    """Topics and subscribers of the config in force, by name and by store id."""

    def __init__(self) -> None:
        self.config: Config  # set by install, before anything reads it
        self.topics: dict[str, TopicConfig] = {}
        self.sub_configs: dict[str, SubscriberConfig] = {}
        self.sub_topics: dict[str, list[TopicConfig]] = {}  # subscriber -> the topics it takes
        self.topic_by_id: dict[int, str] = {}
        self.sub_by_id: dict[int, str] = {}
        self.pulled: frozenset[str] = frozenset()  # the Pull subscribers (PROTOCOL §9)
        self.pushed: frozenset[str] = frozenset()  # the others: no message of theirs has a taker
        self.sub_ids_of: dict[str, list[int]] = {}  # topic -> the store ids of its subscribers, in config order
        self.subs_by_name: dict[str, list[str]] = {}  # topic -> its subscribers by name: the order they are filled in
        self.rules: Rules  # the access rules of config, set by install
        self.topic_order: dict[str, int] = {}  # topic -> its place in the config: the order subscribers are filled in
        self.windows: dict[str, int] = {}  # subscriber -> its Window a connection (PROTOCOL §3)
        self.in_flight_max: dict[str, int] = {}  # subscriber -> what all its connections' Windows hold, a topic
        # (topic id, subscriber id) of the subscribers with Connections > 1, whose lanes a step fills
        self.laned: frozenset[tuple[int, int]] = frozenset()

    def install(self, config: Config, state: State) -> None:
        """Make `config` the one in force; `state` has registered its topics and subscribers."""
        self.config = config
        self.topics = {t.name: t for t in config.topics}
        self.sub_configs = {s.name: s for s in config.subscribers}
        self.sub_topics = {s.name: [t for t in config.topics if s.name in t.subscribers] for s in config.subscribers}
        self.topic_by_id = {i: n for n, i in state.topic_ids.items()}
        self.sub_by_id = {i: n for n, i in state.sub_ids.items()}
        self.pulled = frozenset(s.name for s in config.subscribers if s.pull)
        self.pushed = frozenset(s.name for s in config.subscribers if not s.pull)
        self.sub_ids_of = {t.name: [state.sub_ids[name] for name in t.subscribers] for t in config.topics}
        self.subs_by_name = {t.name: sorted(t.subscribers) for t in config.topics}
        self.rules = Rules(config)
        self.topic_order = {t.name: i for i, t in enumerate(config.topics)}
        self.windows = {s.name: config.window(s) for s in config.subscribers}
        self.in_flight_max = {s.name: config.window(s) * s.connections for s in config.subscribers}
        self.laned = frozenset(
            (state.topic_ids[t.name], state.sub_ids[s.name])
            for s in config.subscribers
            if s.connections > 1
            for t in self.sub_topics[s.name]
        )

    def snapshot(self) -> Snapshot:
        """What `restore` puts back: every field, in one C-level copy (taken at
        every step and every undoable request)."""
        return self.__dict__.copy()

    def restore(self, snapshot: Snapshot) -> None:
        """Back to what `snapshot` held: an undone reload never happened."""
        self.__dict__.update(snapshot)

    # --- names in requests, looked up in the config in force ------------------------------

    def topic_for(self, req: p.Request, field: str) -> TopicConfig:
        """The request's Topic, which `field` needs; 400 without one, 404 for an unknown one."""
        if req.topic is None:
            raise BadRequest(f"Topic: required with {field}")
        topic = self.topics.get(req.topic)
        if topic is None:
            raise NotFound(f"Topic: unknown topic {req.topic!r}")
        return topic

    def subscriber_of(self, name: str | None, topic: TopicConfig, field: str) -> str:
        """`name`, a subscriber of topic, which `field` needs; 400 without one, 404 otherwise."""
        if name is None:
            raise BadRequest(f"Subscriber: required with {field}")
        if name not in self.sub_topics:
            raise NotFound(f"Subscriber: unknown subscriber {name!r}")
        if name not in topic.subscribers:
            raise NotFound(f"Subscriber: {name!r} is not subscribed to topic {topic.name!r}")
        return name

    def topics_of_subscriber(self, req: p.Request, command: str) -> list[TopicConfig]:
        """The topics a RECONNECT, PAUSE or RESUME names: its Topic, or all of its subscriber's."""
        if req.subscriber is None:
            raise BadRequest(f"Subscriber: required with {command}")
        if req.subscriber not in self.sub_topics:
            raise NotFound(f"Subscriber: unknown subscriber {req.subscriber!r}")
        if req.topic is None:
            return self.sub_topics[req.subscriber]
        topic = self.topic_for(req, command)
        self.subscriber_of(req.subscriber, topic, command)
        return [topic]
