"""The `ppmq` commands of delivery control and for operators (PROTOCOL §8): ack,
nack, reject, peek, purge, redrive, pause, resume, ping; and what every command
shares: -c and -s, the config they name, the client, durations, --json.

Each sends one wrapper and prints what the broker answered; a status other than
200 raises ClientError, which `ppmq` turns into exit 1 as for the other commands.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from ppmq.client.library import DEFAULT_TIMEOUT_S, Client
from ppmq.config import Config, default_config_path, load_config, parse_duration
from ppmq.errors import ClientError, ConfigError
from ppmq.protocol.messages import Reply

# cli/main.py's factory of a subcommand: (name, handler, help, example) -> its parser, with -c/-s;
# also config=False: no -c/-s, socket=False: no -s, result=...: --json; a None handler: its subcommands set one
Command = Callable[..., argparse.ArgumentParser]
PAYLOAD_CHARS = 40  # of a payload's JSON in peek's table; a longer one is cut and ends in "…"
_PEEK_COLUMNS = ("SUBSCRIBER", "STATE", "KEY", "PRIORITY", "ATTEMPT", "PUBLISHED", "DEADLINE", "PAYLOAD")


def config_options(parser: argparse.ArgumentParser, socket: bool = True) -> None:
    """-c, which every command that reads the config takes, and -s, which those that
    talk to the broker take (`socket` False: a command that never does)."""
    parser.add_argument("-c", "--config", default=None, help="config file (default: $PPMQ_CONFIG, then /etc/ppmq/ppmq.yaml)")
    if socket:
        parser.add_argument("-s", "--socket", default=None, help="server socket (default: ServerSocket of the config)")


def examples(*lines: str) -> str:
    """The end of a command's --help: how it is typed, a line each."""
    return "example:\n" + "\n".join(f"  {line}" for line in lines)


def json_option(parser: argparse.ArgumentParser, what: str) -> None:
    """--json: the command prints its result as one JSON object, for scripts and jq."""
    parser.add_argument("--json", action="store_true", help=f"print the result as JSON: {what}")


def show(args: argparse.Namespace, line: str, result: Any) -> None:
    """A command's result on stdout: `line` for a person, `result` as JSON with --json."""
    print(msgspec.json.encode(result).decode() if args.json else line)


def config_path(args: argparse.Namespace) -> str:
    """The config file of a command: -c, else $PPMQ_CONFIG, else /etc/ppmq/ppmq.yaml.
    One that does not exist is an error that says where the path came from and how
    to name another, since a newcomer's first command usually has neither."""
    path = args.config or default_config_path()
    if not os.path.exists(path):
        origin = "given with -c" if args.config else "from PPMQ_CONFIG" if os.environ.get("PPMQ_CONFIG") else "the default"
        raise ConfigError([f"no config file at {path} ({origin}); name one with -c FILE or PPMQ_CONFIG=FILE"])
    return path


def config_of(args: argparse.Namespace) -> Config:
    """The config of a command, loaded and checked (see config_path)."""
    return load_config(config_path(args))


def open_client(args: argparse.Namespace, timeout_s: float = DEFAULT_TIMEOUT_S) -> Client:
    """The broker named by -s, or by ServerSocket of the config. Here rather than in
    cli/main.py, which imports this module: cli runs as __main__, so it cannot be imported back."""
    return Client(args.socket or config_of(args).server_socket, timeout_s)


def duration(text: str) -> float:
    """An argparse type for --ttl, --delay and --wait: seconds, written as the config
    writes a duration ("90s", "5m", "1h30m", "250ms") or as a plain number. The
    config's parser decides what is a duration; a wait cannot be NaN or endless
    either, and saying so before asking the broker makes it a usage error (exit 2)."""
    try:
        number: float | str = float(text)
    except ValueError:
        number = text
    try:
        value = parse_duration(number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite duration: {text!r}")
    return value


def positive(text: str) -> int:
    """An argparse type for -n: a peek at or a take of no messages would do nothing."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def align(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as lines of left-aligned columns, each as wide as its widest value."""
    widths = [max(map(len, column)) for column in zip(*rows)]
    return ["  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in rows]


# --- the parser ------------------------------------------------------------------------


def add_commands(command: Command) -> None:
    """This module's subcommands, made by cli/main.py's factory so that they take -c/-s
    and the man page shows them like every other command."""
    nack = in_flight_command(
        command,
        "nack",
        "give messages in flight back to their queue, to be delivered again",
        examples("ppmq nack jobs worker 42 --delay 30s   # due again in 30 s"),
    )
    nack.add_argument(
        "--delay", type=duration, metavar="DURATION", help='how long before they may be delivered again: "90s", "5m" or seconds (default 0)'
    )
    in_flight_command(
        command,
        "reject",
        "give up on messages in flight: dead-letter them, or drop them without a DeadLetter",
        examples("ppmq reject jobs worker 43   # to the topic's DeadLetter, Reason rejected"),
    )
    peek = command(
        "peek",
        _peek,
        "show messages of a topic in delivery order, ready ones first, without changing anything",
        examples("ppmq peek jobs --subscriber worker --state inflight", "ppmq peek jobs-dead -n 100 --json | jq '.Messages[].Origin'"),
        result="the PEEK body",
    )
    peek.add_argument("topic", help="the topic whose messages to show")
    peek.add_argument("--subscriber", help="only this subscriber's copies")
    peek.add_argument("--state", choices=("ready", "inflight"), help="only ready or only in-flight copies")
    peek.add_argument("-n", "--limit", type=positive, default=10, metavar="N", help="at most N messages (default 10, at most 1000)")
    purge = command(
        "purge",
        _purge,
        "remove ready and in-flight messages of a topic",
        examples("ppmq purge jobs --subscriber worker   # asks first", "ppmq purge jobs --key 42 --key 43 --yes"),
        result="how many copies were removed",
    )
    purge.add_argument("topic", help="the topic whose messages to remove")
    purge.add_argument("--subscriber", help="only this subscriber's copies")
    purge.add_argument("--key", "-k", action="append", dest="keys", metavar="K", help="only messages with key K (repeat for more keys)")
    purge.add_argument("--yes", "-y", action="store_true", help="do not ask first (needed when standard input is not a terminal)")
    redrive = command(
        "redrive",
        _redrive,
        "move dead-lettered messages back to the topic and subscriber they came from",
        examples("ppmq redrive jobs-dead", "ppmq redrive jobs-dead --key 7"),
        result="how many were moved back and how many skipped",
    )
    redrive.add_argument("topic", metavar="DEADTOPIC", help="a topic that is the DeadLetter of others")
    redrive.add_argument(
        "--key", "-k", action="append", dest="keys", metavar="K", help="only the message with key K (repeat for more keys)"
    )
    for name, help in (
        ("pause", "deliver nothing more to a subscriber until `ppmq resume` (survives a restart of the broker)"),
        ("resume", "deliver again to a paused subscriber"),
    ):
        sub = command(
            name,
            _pause_or_resume,
            help,
            examples(f"ppmq {name} worker", f"ppmq {name} worker --topic jobs"),
            result="the subscriber and topic",
        )
        sub.add_argument("subscriber", help=f"the subscriber to {name}")
        sub.add_argument("--topic", "-t", help="on this topic only (default: every topic of the subscriber)")
    command("ping", _ping, "show that the broker answers, its version and its uptime", examples("ppmq ping"), result="the PING body")


def in_flight_command(command: Command, name: str, help: str, example: str) -> argparse.ArgumentParser:
    """ack, nack and reject name the same things: keys in flight to a subscriber."""
    sub = command(name, settle, help, example, result="how many keys applied and how many were not in flight")
    sub.add_argument("topic", help="the topic the messages were delivered on")
    sub.add_argument("subscriber", help="the subscriber they are in flight to")
    sub.add_argument("keys", nargs="+", metavar="KEY", help="the Key of each message, as delivered")
    return sub


# --- the commands --------------------------------------------------------------------


def _request(args: argparse.Namespace, **keys: Any) -> Reply:
    """Send one wrapper of the keys given, leaving out the None ones: an option not
    given is a key not sent, so the broker's default applies."""
    with open_client(args) as client:
        return client.request({name: value for name, value in keys.items() if value is not None})


_SETTLEMENTS = {"ack": ("Acks", "acked"), "nack": ("Nacks", "nacked"), "reject": ("Rejects", "rejected")}


def settle(args: argparse.Namespace) -> int:
    """ack, nack or reject the keys given. The broker ignores a key that is not in
    flight to the subscriber (unknown, settled already, or another subscriber's)
    and counts only those it applied, so the difference is said on stderr: when
    none applied, naming the keys; the request itself succeeded (exit 0)."""
    field, done = _SETTLEMENTS[args.command]
    keys = list(dict.fromkeys(args.keys))  # a key given twice is settled once
    applied = (
        _request(args, Topic=args.topic, Subscriber=args.subscriber, Delay=getattr(args, "delay", None), **{field: keys}).accepted or 0
    )
    show(args, f"{done} {applied}", {done.capitalize(): applied, "NotInFlight": len(keys) - applied})
    if applied < len(keys):
        which = ", ".join(keys) if applied == 0 else f"{len(keys) - applied} of the {len(keys)} keys"
        print(
            f"ppmq {args.command}: not in flight to subscriber {args.subscriber!r} on topic {args.topic!r}, so ignored: {which}"
            " (unknown, settled already, or in flight to another subscriber)",
            file=sys.stderr,
        )
    return 0


def _peek(args: argparse.Namespace) -> int:
    body = _request(args, Command="PEEK", Topic=args.topic, Subscriber=args.subscriber, State=args.state, Limit=args.limit).body
    if args.json:
        show(args, "", body)
        return 0
    print("\n".join(align([_PEEK_COLUMNS, *map(_peek_row, body["Messages"])])))
    if body["Next"] is not None:
        print("ppmq peek: more messages follow; -n up to 1000 shows more", file=sys.stderr)
    return 0


def _peek_row(m: dict[str, Any]) -> tuple[str, ...]:
    payload = msgspec.json.encode(m["Payload"]).decode()
    if len(payload) > PAYLOAD_CHARS:
        payload = payload[: PAYLOAD_CHARS - 1] + "…"
    fields = (m["Subscriber"], m["State"], m["Key"], m["Priority"], m["Attempt"], m["Published"], m["Deadline"], payload)
    return tuple("-" if value is None else str(value) for value in fields)


def _purge(args: argparse.Namespace) -> int:
    """PURGE cannot be undone, so a person is asked first, and a script must say --yes."""
    if not args.yes:
        if not sys.stdin.isatty():
            print("ppmq purge: standard input is not a terminal, so nobody can be asked; pass --yes to purge", file=sys.stderr)
            return 2
        count = _purge_count(args)
        if not _confirmed(f"purge {_purge_scope(args)}{'' if count is None else f' ({count} now)'}? [y/N] "):
            print("ppmq purge: nothing purged", file=sys.stderr)
            return 1
    body = _request(args, Command="PURGE", Topic=args.topic, Subscriber=args.subscriber, Keys=args.keys).body
    show(args, f"purged {body['Purged']}", body)
    return 0


def _purge_scope(args: argparse.Namespace) -> str:
    what = "the messages with key " + ", ".join(map(repr, args.keys)) if args.keys else "every message"
    whose = f" for subscriber {args.subscriber!r}" if args.subscriber else ""
    return f"{what} of topic {args.topic!r}{whose}, ready and in flight"


def _purge_count(args: argparse.Namespace) -> int | None:
    """How many copies PURGE would remove now, as it counts them (a message held by
    two subscribers is two): from STATUS without keys; with keys, from PEEK, page by
    page, since only the messages themselves show their keys. None when the peer
    may purge but not ask STATUS (StatusUsers): the question then goes without."""
    if not args.keys:
        try:
            status = _request(args, Command="STATUS", Topic=args.topic).body
        except ClientError as exc:
            if exc.status == 403:
                return None
            raise
        subscribers = status["Topics"][args.topic]["Subscribers"]
        held = [s for name, s in subscribers.items() if args.subscriber in (None, name)]
        return sum(sum(s["Ready"]) + s.get("Delayed", 0) + s["InFlight"] for s in held)
    count, after, keys = 0, None, set(args.keys)
    while True:
        body = _request(args, Command="PEEK", Topic=args.topic, Subscriber=args.subscriber, Limit=1000, After=after).body
        count += sum(m["Key"] in keys for m in body["Messages"])
        after = body["Next"]
        if after is None:
            return count


def _confirmed(question: str) -> bool:
    """Ask on stderr, so that the question is seen even when stdout goes to a file;
    only y or yes is a yes, and end of input is a no."""
    print(question, end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _redrive(args: argparse.Namespace) -> int:
    body = _request(args, Command="REDRIVE", Topic=args.topic, Keys=args.keys).body
    show(args, f"redriven {body['Redriven']}, skipped {body['Skipped']}", body)
    return 0


def _pause_or_resume(args: argparse.Namespace) -> int:
    _request(args, Command=args.command.upper(), Subscriber=args.subscriber, Topic=args.topic)
    show(args, f"{args.command}d subscriber {args.subscriber!r} {topics_named(args)}", subscriber_result(args))
    return 0


def topics_named(args: argparse.Namespace) -> str:
    """The topics a command for a subscriber acts on, in words: --topic, or all of its."""
    return f"on topic {args.topic!r}" if args.topic else "on every topic it is on"


def subscriber_result(args: argparse.Namespace) -> dict[str, Any]:
    """What pause, resume and reconnect did, as JSON: the command, whom, on which topic (null: every topic)."""
    return {"Command": args.command.upper(), "Subscriber": args.subscriber, "Topic": args.topic}


def _ping(args: argparse.Namespace) -> int:
    body = _request(args, Command="PING").body
    show(args, f"ppmq {body['Version']}, up {float(body['UptimeSeconds']):.1f}s", body)
    return 0
