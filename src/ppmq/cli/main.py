"""The `ppmq` command (PROTOCOL §7). Exit status: 0 ok, 1 the request failed, 2 usage."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import msgspec
import uvloop

from ppmq import sockets
from ppmq.cli import bridge, take, top
from ppmq.cli import control as cli_control
from ppmq.cli.control import align, config_of, config_options, config_path, duration, examples, json_option, open_client, show
from ppmq.client import calls
from ppmq.client.library import Client
from ppmq.config import load_config
from ppmq.errors import ClientError, ConfigError, Failure, FsckError, ListenError, StoreError
from ppmq.protocol.framing import Framer
from ppmq.server import daemon
from ppmq.server.metrics import exposition
from ppmq.store.fsck import fsck
from ppmq.store.schema import SCHEMA_VERSION
from ppmq.store.store import Store, missing_store
from ppmq.systemd import configure_logging, listening_unix_socket
from ppmq.version import ppmq_version

log = logging.getLogger("ppmq")
STDIN_BATCH = 1000  # messages per request when publishing lines from stdin


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # a program of its own, with its own options
        from ppmq.bench.cli import main as bench

        return bench(argv[1:])
    args = _parse(argv)
    configure_logging()
    try:
        return args.func(args) or 0
    except (Failure, ConfigError, ClientError) as exc:
        print(f"ppmq {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 1


def _parse(argv: list[str]) -> argparse.Namespace:
    """Options may follow PAYLOADs (`publish T "hi" --priority 1`), so a subcommand
    with arguments left over is parsed again with interleaving allowed."""
    parser, subparsers = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest:
        tail = argv[argv.index(args.command) + 1 :]
        args = subparsers[args.command].parse_intermixed_args(tail, argparse.Namespace(command=args.command))
    _require_utf8(subparsers[args.command], args)
    return args


PATH_ARGUMENTS = frozenset({"config", "socket", "path"})  # handed to the OS, which takes any bytes


def _require_utf8(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error naming the first argument that is not UTF-8. Python hands
    such bytes over as lone surrogates (PEP 383), which a topic, a key, a payload
    or a NATS URL cannot be encoded from; file paths stay as the OS gave them."""
    while True:
        chosen: argparse.ArgumentParser | None = None  # the subcommand given, whose arguments come next
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                command: str | None = getattr(args, action.dest, None)
                chosen = action.choices.get(command) if command is not None else None
                continue
            value = getattr(args, action.dest, None)
            for text in value if isinstance(value, list) else [value]:
                if action.dest not in PATH_ARGUMENTS and isinstance(text, str) and not _is_utf8(text):
                    name = "/".join(action.option_strings) or action.metavar or action.dest
                    parser.error(f"argument {name}: not UTF-8: {os.fsencode(text)!r}")
        if chosen is None:
            return
        parser = chosen


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="ppmq", description="Persistent, prioritized message broker for one host.")
    parser.add_argument("--version", action="version", version=f"ppmq {ppmq_version()}", help="print the version of ppmq and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    subparsers: dict[str, argparse.ArgumentParser] = {}

    def command(
        name: str, func, help: str, example: str, config: bool = True, socket: bool = True, result: str | None = None
    ) -> argparse.ArgumentParser:
        """A subcommand whose --help ends with `example`. `func` None: its own
        subcommands set one (`bridge to`); `config` False: no -c (nor -s), `socket`
        False: no -s, for a command that reads the config but never asks the broker;
        `result`: what --json prints, for a command that prints a result."""
        sub = commands.add_parser(name, help=help, description=help, epilog=example, formatter_class=argparse.RawDescriptionHelpFormatter)
        if config:
            config_options(sub, socket)
        if result is not None:
            json_option(sub, result)
        if func is not None:
            sub.set_defaults(func=func)
        subparsers[name] = sub
        return sub

    command("serve", _serve, "run the broker in the foreground", examples("ppmq serve -c ppmq.yaml   # until Ctrl-C or SIGTERM"))
    command(
        "check",
        _check,
        "validate a config file",
        examples("ppmq check -c /etc/ppmq/ppmq.yaml", "ppmq check -c ppmq.yaml --json"),
        socket=False,
        result="the problems (none: the numbers of topics and subscribers too)",
    )
    reload = command(
        "reload",
        _reload,
        "validate a config file, then have the broker PID reload it (what `systemctl reload ppmq` runs)",
        examples("ppmq reload -c /etc/ppmq/ppmq.yaml 4242   # 4242: the broker's pid"),
        socket=False,
        result="the check's problems (none: the numbers of topics and subscribers too)",
    )
    reload.add_argument("pid", type=int, metavar="PID", help="the broker's process id ($MAINPID in its unit)")
    command(
        "fsck",
        _fsck,
        "check the store under DataPath: indexes, messages and counters agree (read-only; the broker may run)",
        examples("ppmq fsck -c /etc/ppmq/ppmq.yaml", "ppmq fsck -c /etc/ppmq/ppmq.yaml --json | jq .Problems"),
        socket=False,
        result="the problems and the counts of messages",
    )
    command(
        "migrate",
        _migrate,
        "convert a store an older ppmq wrote to this ppmq's schema (the broker also does it when it starts)",
        examples("systemctl stop ppmq && ppmq migrate -c /etc/ppmq/ppmq.yaml"),
        socket=False,
        result="DataPath, its schema and whether it was converted",
    )
    pub = command(
        "publish",
        _publish,
        "publish messages and wait for them to be stored",
        examples(
            'ppmq publish filescan "hello" "world" --priority 1',
            'ppmq publish filescan --json \'{"path": "/tmp/x"}\' --key k1 --ttl 5m',
            "ppmq publish filescan - < messages.ndjson   # one Message object a line",
        ),
    )
    pub.add_argument("topic", help="the topic to publish to")
    pub.add_argument(
        "payloads", nargs="+", metavar="PAYLOAD", help="one message per PAYLOAD; '-' reads one Message object per line from stdin"
    )
    pub.add_argument("--key", "-k", help="the messages' Key: required on a Dedupe topic, where a newer message of a key replaces the older")
    pub.add_argument("--priority", "-p", type=int, default=0, help="0 is the highest; below the topic's Priorities (default 0)")
    pub.add_argument("--ttl", type=duration, metavar="DURATION", help='how long until the message expires: "90s", "5m", "1h30m" or seconds')
    pub.add_argument(
        "--delay", type=duration, metavar="DURATION", help='how long before the message may be delivered: "90s", "5m" or seconds'
    )
    pub.add_argument("--json", action="store_true", dest="json_payload", help="PAYLOAD is a JSON value rather than a string")
    cli_control.in_flight_command(
        command, "ack", "acknowledge messages in flight: they are done", examples("ppmq ack filescan printer 17 18")
    )
    rec = command(
        "reconnect",
        _reconnect,
        "redeliver everything in flight to a subscriber",
        examples("ppmq reconnect printer", "ppmq reconnect printer --topic filescan"),
        result="the subscriber and topic",
    )
    rec.add_argument("subscriber", help="the subscriber whose messages in flight go back to its queue")
    rec.add_argument("--topic", "-t", help="on this topic only (default: every topic of the subscriber)")
    take.add_command(command)
    cli_control.add_commands(command)
    bridge.add_commands(command)
    st = command(
        "status",
        _status,
        "show the broker's counters",
        examples("ppmq status", "ppmq status --topic filescan --json"),
        result="the STATUS body",
    )
    st.add_argument("--topic", "-t", help="only this topic")
    top.add_command(command)
    command(
        "metrics",
        _metrics,
        "print the broker's metrics in the Prometheus text format, as its Metrics textfile has them",
        examples("ppmq metrics | grep ppmq_ready"),
    )
    commands.add_parser("bench", help="compare ppmq with peer brokers on named workloads (ppmq bench --help)")
    lis = command(
        "listen",
        _listen,
        "a debugging subscriber: print each batch pushed to SOCKET",
        examples("ppmq listen /run/ppmq/sub/printer.sock --ack   # as printer, acking all"),
    )
    lis.add_argument("path", metavar="SOCKET", help="the subscriber's Socket in the config, to listen on")
    lis.add_argument(
        "--ack",
        action="store_true",
        help="acknowledge every message received: on the delivery connection, or through ServerSocket when -c or -s is given",
    )
    rep = command(
        "report",
        _report,
        "journals of many hosts -> Parquet tables and report.html, on Spark",
        examples("ppmq report /srv/journals/ --out /srv/reports/today"),
        config=False,
    )
    rep.add_argument(
        "paths", nargs="+", metavar="JOURNAL_PATH", help="journal files or directories (searched recursively), any URI Spark reads"
    )
    rep.add_argument("--out", required=True, help="output directory (any URI Spark writes)")
    rep.add_argument("--master", default="local[*]", help="Spark master (default: local[*], bound to loopback)")
    rep.add_argument(
        "--verbose", action="store_true", help="show Spark's own log lines (warnings and up) instead of keeping them out of the terminal"
    )
    return parser, subparsers


# --- broker side ---------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    path = config_path(args)
    config = load_config(path)
    if args.socket:
        config.server_socket = args.socket
    inherited = listening_unix_socket("server")  # before any thread starts
    try:
        # uvloop: asyncio's loop in C. At a paced rate the loop's reads, writes and
        # wake-ups are a message's largest cost beyond the broker's own work.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(daemon.run(config, config_path=path, inherited=inherited))
    except (StoreError, ListenError) as exc:
        raise Failure(str(exc)) from None
    return 0


def _check(args: argparse.Namespace) -> int:
    """Exit 0 for a file that loads, 1 with its problems; with --json the problems
    are the result too (`Problems`, the lines as they are printed otherwise)."""
    path = config_path(args)
    try:
        config = load_config(path)
    except ConfigError as exc:
        if not args.json:
            raise
        show(args, "", {"Path": path, "Problems": exc.errors})
        return 1
    topics, subscribers = len(config.topics), len(config.subscribers)
    show(
        args,
        f"{path}: ok ({topics} topics, {subscribers} subscribers)",
        {"Path": path, "Problems": [], "Topics": topics, "Subscribers": subscribers},
    )
    return 0


def _reload(args: argparse.Namespace) -> int:
    """`ppmq check`, then SIGHUP to the broker, with nothing but Python: a
    minimal system has no /bin/kill. A file that fails the check is not
    signalled: the reload fails visibly, and the broker runs on unchanged."""
    if _check(args):
        return 1
    try:
        os.kill(args.pid, signal.SIGHUP)
    except OSError as exc:
        raise Failure(f"cannot signal the broker, process {args.pid}: {exc.strerror}") from None
    return 0


def _fsck(args: argparse.Namespace) -> int:
    """One line per problem on stdout; exit 0 clean, 1 problems, 2 cannot check."""
    try:
        config = config_of(args)
        problems, snap = fsck(config)
    except (ConfigError, FsckError) as exc:
        print(f"ppmq fsck: {exc}", file=sys.stderr)
        return 2
    counts = {"Messages": len(snap.bodies), "Queued": len(snap.ready), "InFlight": len(snap.inflight)}
    if args.json:
        show(args, "", {"DataPath": config.data_path, "Problems": problems, **counts})
        return 1 if problems else 0
    for problem in problems:
        print(problem)
    verdict = f"{len(problems)} problems" if problems else "clean"
    print(
        f"{config.data_path}: {verdict} ({counts['Messages']} messages, {counts['Queued']} queued, {counts['InFlight']} in flight)",
        file=sys.stderr,
    )
    return 1 if problems else 0


def _migrate(args: argparse.Namespace) -> int:
    config = config_of(args)
    if config.in_memory:
        show(args, "DataPath is mem: there is no store to convert", {"DataPath": "mem", "Schema": None, "Converted": False})
        return 0
    missing = missing_store(config.data_path)
    if missing is not None:
        print(f"ppmq migrate: {missing}", file=sys.stderr)
        return 2
    try:
        store = Store(config.data_path, sync=config.sync, max_bytes=config.max_store_bytes)
    except StoreError as exc:
        raise Failure(str(exc)) from None
    verdict = "converted to" if store.migrated else "already has"
    result = {"DataPath": config.data_path, "Schema": SCHEMA_VERSION, "Converted": store.migrated}
    store.close()
    show(args, f"{config.data_path}: {verdict} schema {SCHEMA_VERSION}", result)
    return 0


# --- client side -----------------------------------------------------------------------


def _publish(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        if args.payloads == ["-"]:
            total = _publish_stdin(client, args.topic)
        else:
            total = client.publish(args.topic, [_message(args, payload) for payload in args.payloads]).accepted
    print(f"published {total}")
    return 0


def _message(args: argparse.Namespace, payload: str) -> dict[str, Any]:
    if args.json_payload:
        try:
            msgspec.json.decode(payload)
        except msgspec.DecodeError as exc:
            raise Failure(f"PAYLOAD is not JSON: {exc}") from None
        value: Any = msgspec.Raw(payload.encode())
    else:
        value = payload
    message: dict[str, Any] = {"Payload": value, "Priority": args.priority}
    if args.key is not None:
        message["Key"] = args.key
    if args.ttl is not None:
        message["TTL"] = args.ttl
    if args.delay is not None:
        message["Delay"] = args.delay
    return message


def _publish_stdin(client: Client, topic: str) -> int:
    total, batch = 0, []
    for n, line in enumerate(sys.stdin.buffer, 1):
        if not line.strip():
            continue
        try:
            msgspec.json.decode(line, type=dict)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise Failure(f"stdin line {n}: not a JSON object: {exc}") from None
        batch.append(msgspec.Raw(line.strip()))
        if len(batch) >= STDIN_BATCH:
            total += client.publish(topic, batch).accepted
            batch = []
    if batch:
        total += client.publish(topic, batch).accepted
    return total


def _reconnect(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        client.reconnect(args.subscriber, args.topic)
    line = f"requeued what was in flight to subscriber {args.subscriber!r} {cli_control.topics_named(args)}, to be delivered again"
    show(args, line, cli_control.subscriber_result(args))
    return 0


def _status(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        body = _status_body(client, args.topic)
    show(args, _status_table(body) if not args.json else "", body)
    return 0


def _metrics(args: argparse.Namespace) -> int:
    """From STATUS, like `ppmq status`: the one view of the counters a client may
    ask for (StatusUsers applies), rendered as the daemon renders its textfile."""
    with open_client(args) as client:
        body = _status_body(client)
    sys.stdout.write(exposition(body).decode())
    return 0


def _status_body(client: Client, topic: str | None = None) -> dict[str, Any]:
    """The STATUS Body as the broker sent it, keys the client library does not know included."""
    body: dict[str, Any] = client.request(calls.status(topic).wrapper).body
    return body


_SUB_COLUMNS = ("SUBSCRIBER", "READY", "DELAYED", "INFLIGHT", "OLDEST", "DELIVERED", "ACKED", "REDELIVERED", "EXPIRED", "DEADLETTERED")


def _status_table(body: dict[str, Any]) -> str:
    """One line per topic with its totals, then its subscribers, in columns aligned
    across all topics so that the tables read as one."""
    tables = [[_SUB_COLUMNS, *(_sub_row(name, s) for name, s in t["Subscribers"].items())] for t in body["Topics"].values()]
    rows = iter(align([row for table in tables for row in table]))
    lines = []
    for (topic, t), table in zip(body["Topics"].items(), tables):
        lines.append(
            f"{topic}: stored {t['Stored']} ({t['StoredBytes']} bytes), published {t['Published']},"
            f" replaced {t['Replaced']}, expired {t['Expired']}, dropped {t['Dropped']}"
        )
        lines += ["  " + next(rows) for _ in table]
    lines.append(f"rejected requests: {body['Rejected']} ({body['Forbidden']} forbidden), commits: {body['Commits']}")
    lines += [_listener_line(name, entry) for name, entry in body.get("Listeners", {}).items()]
    return "\n".join(lines)


def _listener_line(name: str, entry: dict[str, Any]) -> str:
    """A listener's connections, and on PhpmqSocket its frames to queues that do not exist."""
    line = f"{name}: {entry['Connections']} connections"
    if "UnknownQueue" in entry:
        line += f", {entry['UnknownQueue']} frames to unknown queues"
    return line


def _sub_row(name: str, s: dict[str, Any]) -> tuple[str, ...]:
    """One subscriber's line; a paused one is marked after its name (`Paused` and
    `Delayed` are read with defaults: a broker older than this command does not send them)."""
    if s.get("Paused"):
        name += " (paused)"
    age = "-" if s["OldestReadyAge"] is None else f"{s['OldestReadyAge']:.1f}s"
    ready = "/".join(map(str, s["Ready"]))
    counts = (s.get("Delayed", 0), s["InFlight"], age, s["Delivered"], s["Acked"], s["Redelivered"], s["Expired"], s["DeadLettered"])
    return tuple(map(str, (name, ready, *counts)))


def _listen(args: argparse.Namespace) -> int:
    """Bind SOCKET, accept the broker's connections, print batches; Ctrl-C ends it (exit 0)."""
    try:
        server, bound = sockets.listen(os.path.abspath(args.path), 8)
    except ListenError as exc:
        print(f"ppmq listen: {exc}", file=sys.stderr)
        return 1
    print(f"listening on {args.path}", file=sys.stderr)
    via_server = open_client(args) if args.ack and (args.config or args.socket) else None
    try:
        while True:
            conn, _ = server.accept()
            with conn:
                _listen_connection(conn, args.ack, via_server)
    except KeyboardInterrupt:
        return 0
    finally:
        server.close()
        bound.remove()


def _listen_connection(conn: socket.socket, ack: bool, via_server: Client | None) -> None:
    framer = Framer(1 << 30)
    out = sys.stdout
    while data := conn.recv(1 << 16):
        for frame in framer.feed(data):
            batch = msgspec.json.decode(frame)
            if "Status" in batch:
                if batch["Status"] != 200:
                    print(f"ack rejected: {batch.get('Error')}", file=sys.stderr)
                continue
            out.write(frame.decode() + "\n")
            out.flush()
            if not ack:
                continue
            keys = [m["Key"] for m in batch.get("Messages", [])]
            if via_server is not None:
                via_server.ack(batch["Topic"], batch["Subscriber"], keys)
            else:
                wrapper = {"Topic": batch["Topic"], "Subscriber": batch["Subscriber"], "Acks": keys, "Id": 1}
                conn.sendall(msgspec.json.encode(wrapper) + b"\n")
    print("broker closed the connection", file=sys.stderr)


# --- fleet reports ------------------------------------------------------------------------


def _report(args: argparse.Namespace) -> int:
    try:
        from pyspark.errors import AnalysisException
        from pyspark.sql import SparkSession

        from ppmq.pipeline.inputs import without_journals
        from ppmq.pipeline.progress import Progress
        from ppmq.pipeline.report import report
        from ppmq.pipeline.session import REPORT_CONF, local_session, stderr_to
    except ImportError as exc:
        print(
            f"ppmq report: needs PySpark, which the spark extra brings: pip install 'ppmq[spark]' (and Java 17 on PATH); {exc}",
            file=sys.stderr,
        )
        return 2
    if problems := without_journals(args.paths):  # before Spark's start-up, which takes seconds
        raise Failure("; ".join(problems))
    logging.getLogger("py4j").setLevel(logging.WARNING)
    running = SparkSession.getActiveSession()
    with _spark_log(args.verbose) as log:
        with contextlib.nullcontext() if log is None else stderr_to(log):
            spark = local_session(args.master, "ppmq report", "WARN" if args.verbose else "ERROR", **REPORT_CONF)
        try:
            summary = report(spark, args.paths, args.out, Progress(spark.sparkContext, sys.stderr) if sys.stderr.isatty() else None)
        except AnalysisException as exc:
            raise Failure(str(exc).splitlines()[0]) from None
        finally:
            if running is None:  # stop only a session this command started
                spark.stop()
    print(summary.line(args.out))
    return 0


@contextlib.contextmanager
def _spark_log(verbose: bool) -> Iterator[str | None]:
    """A file for what a Spark started here prints, unless `verbose` leaves it on the
    terminal (None); kept, and named, only if the report fails with something in it."""
    if verbose:
        yield None
        return
    fd, log = tempfile.mkstemp(prefix="ppmq-report-", suffix=".log")
    os.close(fd)
    try:
        yield log
    except BaseException:
        if os.path.getsize(log):
            print(f"ppmq report: Spark's log is in {log}", file=sys.stderr)
            raise
        os.unlink(log)
        raise
    os.unlink(log)


if __name__ == "__main__":
    sys.exit(main())
