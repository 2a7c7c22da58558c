"""The `ppmq bridge to|from` commands (PROTOCOL §10): the broker and NATS JetStream.

Each runs until stopped, retrying either side for as long as it is away; exit 1
only for what no retry can fix (the subscriber is not a Pull subscriber, the
bridge extra is not installed), exit 2 for usage.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from ppmq.bridge import from_jetstream as bridge_from
from ppmq.bridge import to_jetstream as bridge_to
from ppmq.cli.control import Command, config_of, config_options, examples
from ppmq.config import Config

log = logging.getLogger("ppmq.bridge")


TO_EXAMPLE = "ppmq bridge to nats://nats1:4222 archive   # every topic archive is on -> subjects ppmq.TOPIC"
FROM_EXAMPLE = "ppmq bridge from nats://nats1:4222 ORDERS ppmq-in orders   # stream ORDERS, consumer ppmq-in -> topic orders"


def add_commands(command: Command) -> None:
    """`bridge` with its two directions, each taking -c/-s like every other command."""
    bridge = command(
        "bridge",
        None,
        "move messages between the broker and NATS JetStream, at least once",
        examples(TO_EXAMPLE, FROM_EXAMPLE),
        config=False,
    )
    directions = bridge.add_subparsers(dest="direction", required=True, metavar="DIRECTION")
    to = _direction(directions, "to", _to, "run as a Pull subscriber and publish what it takes to JetStream", TO_EXAMPLE)
    to.add_argument("url", metavar="NATS_URL", help="the NATS server, e.g. nats://nats1:4222 (nats-py's URL forms)")
    to.add_argument("subscriber", metavar="SUBSCRIBER", help="a subscriber with Pull: true; every topic it is on is bridged")
    to.add_argument("--subject-prefix", default="ppmq.", metavar="PREFIX", help="JetStream subject = PREFIX + topic (default: ppmq.)")
    back = _direction(directions, "from", _from, "publish to TOPIC what a durable JetStream pull consumer fetches", FROM_EXAMPLE)
    back.add_argument("url", metavar="NATS_URL", help="the NATS server, e.g. nats://nats1:4222")
    back.add_argument("stream", metavar="STREAM", help="the JetStream stream; the operator creates it")
    back.add_argument("consumer", metavar="CONSUMER", help="the durable pull consumer's name; the operator creates it")
    back.add_argument("topic", metavar="TOPIC", help="the ppmq topic the messages are published to")


def _direction(
    directions: argparse._SubParsersAction, name: str, func: Callable[[argparse.Namespace], int], help: str, example: str
) -> argparse.ArgumentParser:
    sub = directions.add_parser(
        name, help=help, description=help, epilog=examples(example), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    config_options(sub)
    sub.set_defaults(func=func)
    return sub


def _config(args: argparse.Namespace) -> Config:
    config = config_of(args)
    if args.socket:
        config.server_socket = args.socket
    return config


def _to(args: argparse.Namespace) -> int:
    config = _config(args)
    sub = next((s for s in config.subscribers if s.name == args.subscriber), None)
    if sub is None or not sub.pull:
        return _fail(f"{args.subscriber!r} is not a subscriber with Pull: true in the config")
    topics = bridge_to.subscribed_topics(config, args.subscriber)
    if not topics:
        return _fail(f"{args.subscriber!r} is on no topic")
    if not sub.metadata and any(t.dedupe for t in topics):
        log.warning(
            "%s has no Metadata: true, so on Dedupe topics a key's newer version within the duplicate window is dropped by JetStream",
            sub.name,
        )
    return _run_with_nats(bridge_to.run(config, args.url, args.subscriber, args.subject_prefix))


def _from(args: argparse.Namespace) -> int:
    config = _config(args)
    if not any(t.name == args.topic for t in config.topics):
        return _fail(f"no topic {args.topic!r} in the config")
    return _run_with_nats(bridge_from.run(config.server_socket, args.url, args.stream, args.consumer, args.topic))


def _run_with_nats(bridging: Coroutine[Any, Any, None]) -> int:
    if importlib.util.find_spec("nats") is None:
        bridging.close()
        return _fail("nats-py is missing: install the bridge extra (pip install 'ppmq[bridge]')")
    asyncio.run(bridging)
    return 0


def _fail(text: str) -> int:
    print(f"ppmq bridge: {text}", file=sys.stderr)
    return 1
