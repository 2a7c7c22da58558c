"""`ppmq take`: a Pull subscriber's consumer in a shell (PROTOCOL §9 TAKE), one JSON
line a message, as beanstalk's `reserve` or `nats sub` give them.

By default each message is acked once its line is written to standard output,
so what the shell was given is done and not taken again (a take killed between
the two leaves it unacked, and the broker gives it back). With
--no-ack nothing is acked, and since the broker gives back what a connection took
when the connection closes, the messages go back to their place in the queue as
the command exits (a delivery counted: MaxAttempts applies), to be taken again.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import msgspec

from ppmq.cli.control import Command, duration, examples, open_client, positive
from ppmq.client import calls
from ppmq.client.library import DEFAULT_TIMEOUT_S

TAKE_COUNT_MAX = 10_000  # a TAKE's Count at most (PROTOCOL §9); more are taken in several

EXAMPLE = examples(
    "ppmq take jobs worker                     # one message, if one is ready",
    "ppmq take jobs worker -n 100 --wait 20s   # up to 100, waiting up to 20 s for the first",
    "ppmq take jobs worker | jq -r .Payload    # just the payload",
)
EXAMPLE += "\n\nexit status: 0 when at least one message was printed, 1 when none came (or the request failed)."


def add_command(command: Command) -> None:
    take = command("take", _take, "take messages of a Pull subscriber and print each as a JSON line", EXAMPLE)
    take.add_argument("topic", metavar="TOPIC", help="the topic to take from")
    take.add_argument("subscriber", metavar="SUBSCRIBER", help="a subscriber with Pull: true on TOPIC")
    take.add_argument("-n", "--count", type=positive, default=1, metavar="N", help="take up to N messages (default 1)")
    take.add_argument(
        "--wait",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help='when none is ready, wait this long for one: "20s", "5m" or seconds, at most 1h (default 0: do not wait)',
    )
    acking = take.add_mutually_exclusive_group()
    acking.add_argument(
        "--ack", dest="ack", action="store_true", default=True, help="ack each message once its line is written (the default)"
    )
    acking.add_argument(
        "--no-ack",
        dest="ack",
        action="store_false",
        help="do not ack: the messages go back to the queue when the command exits, a delivery counted",
    )


def _take(args: argparse.Namespace) -> int:
    """Take up to --count messages: those ready now, waiting up to --wait for the
    first. The next TAKE carries the acks of the batch printed before it."""
    printed = 0
    with open_client(args, timeout_s=DEFAULT_TIMEOUT_S + args.wait) as client:
        wait, acks = args.wait, None
        while printed < args.count:
            take = calls.take(args.topic, args.subscriber, min(args.count - printed, TAKE_COUNT_MAX), wait, acks)
            batch = client.request(take.wrapper).body["Messages"]  # each as the broker wrote it
            written = _print(batch)
            printed += len(written)
            acks = written if args.ack else None
            if len(written) < len(batch) or not batch:
                break
            wait = 0.0  # more only if ready now
        if acks:
            client.ack(args.topic, args.subscriber, acks)
    if printed == 0:
        print(f"ppmq take: no message for subscriber {args.subscriber!r} on topic {args.topic!r}", file=sys.stderr)
        return 1
    return 0


def _print(batch: list[dict[str, Any]]) -> list[str]:
    """Write each message as a line, flushed one by one; the keys of those written.
    A reader that went away (`| head -1`) stops the writing, and what it did not
    take is not acked; stdout then goes nowhere, so that exiting does not fail."""
    written = []
    for message in batch:
        try:
            sys.stdout.write(msgspec.json.encode(message).decode() + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            break
        written.append(message["Key"])
    return written
