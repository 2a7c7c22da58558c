"""YAML configuration -> typed, validated Config (PROTOCOL §6).

ppMQ's keys are read unchanged; our extensions are documented in
ppmq.example.yaml. Every error names the file, the line and the key, because the
person reading it is an operator with the file open in an editor. Relative paths
are taken relative to the config file's directory, so that a config works
whatever the current directory of whoever started the broker.
"""

from __future__ import annotations

import copy
import os
import pwd
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from ppmq import sockets
from ppmq.errors import ConfigError

MiB = 1 << 20
_UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the NUL


class Duration(float):
    """Seconds; written as Go durations ("90s", "1h30m", "250ms") or plain numbers."""


class Size(int):
    """Bytes; written as integers or with a unit ("16MiB", "4GiB", "512KB")."""


class FileMode(int):
    """Permission bits, written in octal: 0660 (YAML reads it as octal) or "0660"."""


# When a message taken through zbus counts as acked (PROTOCOL §11): at the
# connection's next take on that mq and channel, at an `ack` command, at sending.
ZBUS_ACK_MODES = ("window", "explicit", "delivery")


class SubscriberConfig(msgspec.Struct, rename="pascal", forbid_unknown_fields=True):
    name: str
    socket: str | None = None  # where the broker pushes; required unless Pull
    batch_size: int = 50  # messages per pushed batch, as in ppMQ
    window: int | None = None  # messages in flight per topic; default batch_size
    users: list[str | int] | None = None  # who may ack or RECONNECT as this subscriber; None: anyone
    check_owner: bool | None = None  # the socket's owner must be root or in Users; default: Users is set
    metadata: bool = False  # delivered messages carry Attempt and Published (PROTOCOL §8); off: ppMQ's frames
    pull: bool = False  # never pushed to: workers TAKE its messages (PROTOCOL §9)
    connections: int = 1  # push connections to Socket at most, each with its own Window (PROTOCOL §9)
    zbus_ack: str = "window"  # when a message taken through zbus counts as acked: window, explicit, delivery (PROTOCOL §11)

    @property
    def owner_checked(self) -> bool:
        return self.check_owner if self.check_owner is not None else self.users is not None


class TopicConfig(msgspec.Struct, rename="pascal", forbid_unknown_fields=True):
    name: str
    subscribers: list[str] = msgspec.field(default_factory=list)
    ack_required: bool = True
    ack_retry: Duration = Duration(0)  # redeliver after this long unacked; 0 = never
    dedupe: bool = False
    priorities: int = 1
    expire: bool = False
    max_messages: int = 0  # stored messages at most; 0 = no limit
    max_bytes: Size | None = None  # stored message bytes at most; None = no limit
    overflow_policy: str = "reject"  # when full: "reject" (507) or "drop-oldest"
    max_attempts: int = 0  # deliveries without an ack before dead-lettering; 0 = unlimited
    dead_letter: str | None = None  # topic that receives dead-lettered messages; None: dropped
    dead_letter_reasons: list[str] = msgspec.field(default_factory=lambda: ["attempts", "rejected"])  # removals copied to DeadLetter
    max_age: Duration | None = None  # the Expires of a message published without one (needs Expire: true)
    phpmq_subscriber: str | None = None  # the pull subscriber PHPMQ consumers of this queue take from (PROTOCOL §9)
    # PHPMQ dispatches carry a TTL packet (4 packets); off: 3, as php-mq/client reads them (PROTOCOL §9)
    phpmq_dispatch_ttl: bool = msgspec.field(default=False, name="PhpmqDispatchTTL")
    publishers: list[str | int] | None = None  # who may publish; None: anyone

    @property
    def limited(self) -> bool:
        return bool(self.max_messages or self.max_bytes)


class JournalConfig(msgspec.Struct, rename="pascal", forbid_unknown_fields=True):
    """The delivery journal under DataPath/journal/ (docs/journal.md)."""

    enabled: bool = True  # off anyway with DataPath: mem
    segment_bytes: Size = Size(64 * MiB)  # a segment this large is closed and gzipped
    max_bytes: Size = Size(1024 * MiB)  # oldest segments are deleted to stay under this
    host: str | None = None  # the Host of every record; default the host's name


class MetricsConfig(msgspec.Struct, rename="pascal", forbid_unknown_fields=True):
    """Prometheus metrics written to a file for node_exporter's textfile collector (PROTOCOL §10)."""

    textfile: str  # replaced whole every Interval and at stop; node_exporter reads *.prom
    interval: Duration = Duration(15.0)


class ZbusKey(msgspec.Struct, rename="pascal", forbid_unknown_fields=True):
    """A zbus client's key (PROTOCOL §11): a request signed with `Secret` under
    `ApiKey` is judged as the local user `User`."""

    api_key: str
    secret: str
    user: str | int


class Config(msgspec.Struct, rename="pascal", forbid_unknown_fields=True):
    server_socket: str
    data_path: str
    phpmq_socket: str | None = None  # where the broker also speaks the PHPMQ protocol (PROTOCOL §9)
    zbus_socket: str | None = None  # where the broker also speaks zbus over HTTP and WebSocket (PROTOCOL §11)
    zbus_listen: str | None = None  # HOST:PORT where the broker also speaks zbus over TCP, every request signed (PROTOCOL §11)
    zbus_keys: list[ZbusKey] = msgspec.field(default_factory=list)  # the keys zbus requests are signed with
    subscribers: list[SubscriberConfig] = msgspec.field(default_factory=list)
    topics: list[TopicConfig] = msgspec.field(default_factory=list)
    sync: bool = True  # fsync at every commit; false leaves flushing to the OS
    max_frame_bytes: Size = Size(16 * MiB)
    max_message_bytes: Size = Size(1 * MiB)  # per payload
    max_store_bytes: Size = Size(4096 * MiB)  # LMDB grows on demand up to this; then 507
    retry_max: Duration = Duration(5.0)  # cap of the reconnect backoff to subscribers
    max_connections: int = 0  # open connections on ServerSocket, more are refused; 0: from the open-file limit
    read_timeout: Duration = Duration(30.0)  # a frame must arrive whole within this of its first byte
    socket_mode: FileMode = FileMode(0o660)  # of ServerSocket when the broker binds it
    socket_group: str | None = None  # group of ServerSocket; None: the broker's own group
    status_users: list[str | int] | None = None  # who may ask STATUS; None: anyone
    admin_users: list[str | int] | None = None  # who may PEEK, PURGE, REDRIVE, PAUSE, RESUME; None: root and the broker's user
    allow_root: bool = True  # uid 0 passes every Users/Publishers/StatusUsers/AdminUsers rule
    drop_topics: list[str] = msgspec.field(default_factory=list)  # removed topics whose messages may be deleted
    journal: JournalConfig = msgspec.field(default_factory=JournalConfig)
    metrics: MetricsConfig | None = None

    def window(self, sub: SubscriberConfig) -> int:
        return sub.window if sub.window is not None else sub.batch_size

    @property
    def in_memory(self) -> bool:
        return self.data_path == "mem"

    @property
    def journaled(self) -> bool:
        """Whether the broker keeps a delivery journal: a throwaway store has none."""
        return self.journal.enabled and not self.in_memory


# --- loading ------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, validate and resolve a config file; raise ConfigError naming every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read: {exc}"]) from None
    return parse_config(text, path)


def parse_config(text: str, path: Path) -> Config:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError([f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}:1: the top level must be a mapping of keys such as ServerSocket"])
    try:
        config = msgspec.convert(data, Config, dec_hook=_decode_unit)
    except msgspec.ValidationError as exc:
        problems = list(_decode_problems(data, Config, ""))
        if not problems:  # the walk missed what the decoder saw: say what it said
            msg, _, where = str(exc).partition(" - at `$")
            problems = [(where.rstrip("`"), msg)]
        problems += _checked_around(data, problems, path.parent)
        raise ConfigError(_sorted_by_line(path, [_locate(path, root, where, msg) for where, msg in problems])) from None
    config = _resolved(config, path.parent)
    errors = [_locate(path, root, where, msg) for where, msg in _check(config)]
    if errors:
        raise ConfigError(_sorted_by_line(path, errors))
    return config


def _sorted_by_line(path: Path, errors: list[str]) -> list[str]:
    """`file:line: ...` errors in the order of their lines, as an editor shows the file."""
    return sorted(errors, key=lambda error: int(error[len(str(path)) + 1 :].split(":", 1)[0]))


def _decode_problems(data: Any, tp: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every problem decoding `data` as `tp` meets, where the decoder stops at the
    first: each mapping's keys are checked one by one against the Struct's fields,
    and each value against its field's type. Paths are written as msgspec writes them."""
    struct = _struct_in(tp)
    if struct is not None and isinstance(data, dict):
        fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
        for key, value in data.items():
            field = fields.get(key)
            if field is None:
                import difflib  # only a config with a mistake needs it, not the broker that loads a good one

                guess = difflib.get_close_matches(str(key), fields, n=1)
                yield where, f"unknown field `{key}`" + (f"; did you mean {guess[0]}?" if guess else "")
            else:
                yield from _decode_problems(value, field.type, f"{where}.{key}")
        yield from ((f"{where}.{name}", "required, but missing") for name, f in fields.items() if f.required and name not in data)
        return
    item = _struct_in(getattr(tp, "__args__", (None,))[0]) if getattr(tp, "__origin__", None) is list else None
    if item is not None and isinstance(data, list):
        for i, value in enumerate(data):
            yield from _decode_problems(value, item, f"{where}[{i}]")
        return
    try:
        msgspec.convert(data, tp, dec_hook=_decode_unit)
    except msgspec.ValidationError as exc:
        msg, _, inner = str(exc).partition(" - at `$")
        yield where + inner.rstrip("`"), _in_config_words(msg, data if not inner else None)


def _struct_in(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct a field's type names (`MetricsConfig | None` names MetricsConfig), if any."""
    for candidate in (tp, *getattr(tp, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


_TYPE_WORDS = {
    "bool": "true or false",
    "int": "a whole number",
    "float": "a number",
    "str": "a string",
    "array": "a list, such as [a, b]",
    "object": "a mapping of keys",
}
_VALUE_WORDS = {
    "int": "a number",
    "float": "a number",
    "str": "a string",
    "array": "a list",
    "object": "a mapping",
    "bool": "true or false",
}
_EXPECTED = re.compile(r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`")


def _in_config_words(msg: str, value: Any) -> str:
    """The decoder's "Expected `bool`, got `int`" as the file's author reads it: "use
    true or false, not 4". Other messages (a duration's, a size's) are ours already."""
    m = _EXPECTED.fullmatch(msg)
    if m is None:
        return msg
    wants = [_TYPE_WORDS.get(w, w) for w in m["want"].split(" | ") if w != "null"]
    if value is None or isinstance(value, (list, dict)):
        shown = _VALUE_WORDS.get(m["got"], m["got"])
    elif isinstance(value, bool):
        shown = str(value).lower()
    else:
        shown = repr(value)
    return f"use {' or '.join(wants)}, not {shown}"


def _checked_around(data: dict[str, Any], problems: list[tuple[str, str]], base: Path) -> list[tuple[str, str]]:
    """The checks across fields, run on the file without the keys that failed to
    decode (each takes its default), so that one run reports those problems too.
    None of them when a failed key cannot be left out (a required one, a list
    item) or the rest does not decode either; none at a key already reported."""
    cleaned = copy.deepcopy(data)
    for where, msg in problems:
        unknown = re.match(r"unknown field `([^`]+)`", msg)
        parent, key = (where, unknown[1]) if unknown else where.rpartition(".")[::2]
        holder = _at(cleaned, parent)
        if msg == "required, but missing" or not isinstance(holder, dict) or key not in holder:
            return []
        del holder[key]
    try:
        config = _resolved(msgspec.convert(cleaned, Config, dec_hook=_decode_unit), base)
    except msgspec.ValidationError:
        return []
    reported = {where for where, _ in problems}
    return [(where, msg) for where, msg in _check(config) if where not in reported]


def _at(data: Any, where: str) -> Any:
    """The value at a msgspec path (`.Topics[0]`), or None when there is none."""
    for key, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", where):
        if key and isinstance(data, dict):
            data = data.get(key)
        elif index and isinstance(data, list) and int(index) < len(data):
            data = data[int(index)]
        else:
            return None
    return data


def _decode_unit(tp: type, obj: Any) -> Any:
    if tp is Duration:
        return Duration(parse_duration(obj))
    if tp is Size:
        return Size(parse_size(obj))
    if tp is FileMode:
        return FileMode(parse_mode(obj))
    raise NotImplementedError


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """Go's time.ParseDuration for non-negative values, or a number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f'expected a duration such as "90s" or a number of seconds, got {value!r}')
    if isinstance(value, str):
        text = value.strip()
        if text == "0":
            return 0.0
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f'invalid duration {value!r} (use e.g. "90s", "5m", "1h30m", "250ms")')
        value = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if value < 0:
        raise ValueError(f"duration {value!r} must not be negative")
    return float(value)


_SIZE = re.compile(r"(\d+)\s*([KMGT]i?B?|B)?", re.I)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}


def parse_size(value: Any) -> int:
    """Bytes as an integer or "16MiB"/"4GB"/"512K" (KiB-style units are powers of 1024)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f'expected a size such as 16777216 or "16MiB", got {value!r}')
    if isinstance(value, str):
        m = _SIZE.fullmatch(value.strip())
        if not m:
            raise ValueError(f'invalid size {value!r} (use e.g. 16777216, "16MiB", "4GB")')
        unit = (m[2] or "").upper()
        base = 1024 if "I" in unit else 1000
        value = int(m[1]) * (base ** "BKMGT".index(unit[0]) if unit else 1)
    if value <= 0:
        raise ValueError(f"size {value!r} must be positive")
    return value


def parse_mode(value: Any) -> int:
    """Permission bits as YAML's octal integer (0660) or an octal string ("0660", "660")."""
    if isinstance(value, str) and re.fullmatch(r"0?o?[0-7]{3,4}", value.strip()):
        return int(value.strip().replace("o", ""), 8)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0o7777:
        return value
    raise ValueError(f"invalid mode {value!r} (write it in octal, e.g. 0660)")


OVERFLOW_POLICIES = ("reject", "drop-oldest")
DEAD_LETTER_REASONS = ("attempts", "rejected", "expired", "overflow")  # why a copy is dead-lettered (PROTOCOL §8)


def _check(config: Config) -> list[tuple[str, str]]:
    """Checks across fields: (path, message) pairs, paths as msgspec writes them."""
    errors: list[tuple[str, str]] = []
    named: tuple[tuple[str, Sequence[SubscriberConfig | TopicConfig]], ...] = (
        ("Subscribers", config.subscribers),
        ("Topics", config.topics),
    )
    for kind, items in named:
        seen: set[str] = set()
        for i, item in enumerate(items):
            if not item.name:
                errors.append((f".{kind}[{i}].Name", "must not be empty"))
            elif item.name in seen:
                errors.append((f".{kind}[{i}].Name", f"duplicate name {item.name!r}"))
            seen.add(item.name)
    names = {s.name for s in config.subscribers}
    for i, sub in enumerate(config.subscribers):
        if sub.batch_size < 1:
            errors.append((f".Subscribers[{i}].BatchSize", f"must be at least 1, got {sub.batch_size}"))
        if sub.window is not None and sub.window < 1:
            errors.append((f".Subscribers[{i}].Window", f"must be at least 1, got {sub.window}"))
        errors += [(f".Subscribers[{i}]{where}", msg) for where, msg in _check_delivery(sub)]
        if sub.zbus_ack not in ZBUS_ACK_MODES:
            errors.append((f".Subscribers[{i}].ZbusAck", f"must be one of {', '.join(ZBUS_ACK_MODES)}, got {sub.zbus_ack!r}"))
    for i, topic in enumerate(config.topics):
        if not 1 <= topic.priorities <= 256:
            errors.append((f".Topics[{i}].Priorities", f"must be 1..256, got {topic.priorities}"))
        for j, name in enumerate(topic.subscribers):
            if name not in names:
                errors.append((f".Topics[{i}].Subscribers[{j}]", f"unknown subscriber {name!r}"))
        if len(set(topic.subscribers)) != len(topic.subscribers):
            errors.append((f".Topics[{i}].Subscribers", "lists a subscriber twice"))
        errors += [(f".Topics[{i}]{where}", msg) for where, msg in _check_limits(config, topic)]
    if config.max_connections < 0:
        errors.append((".MaxConnections", f"must not be negative, got {config.max_connections}"))
    topic_names = {t.name for t in config.topics}
    for i, name in enumerate(config.drop_topics):
        if name in topic_names:
            errors.append((f".DropTopics[{i}]", f"topic {name!r} is still in Topics; remove it there to drop it"))
    if len(config.server_socket.encode()) > _UNIX_PATH_MAX:
        errors.append((".ServerSocket", f"path longer than {_UNIX_PATH_MAX} bytes"))
    if config.journal.segment_bytes > config.journal.max_bytes:
        errors.append((".Journal.SegmentBytes", f"must not exceed Journal.MaxBytes ({config.journal.max_bytes})"))
    if not config.data_path:
        errors.append((".DataPath", 'must not be empty (a directory, or "mem")'))
    if config.phpmq_socket is not None and len(config.phpmq_socket.encode()) > _UNIX_PATH_MAX:
        errors.append((".PhpmqSocket", f"path longer than {_UNIX_PATH_MAX} bytes"))
    if config.zbus_socket is not None and len(config.zbus_socket.encode()) > _UNIX_PATH_MAX:
        errors.append((".ZbusSocket", f"path longer than {_UNIX_PATH_MAX} bytes"))
    if config.metrics is not None:
        errors += [(f".Metrics{where}", msg) for where, msg in _check_metrics(config.metrics)]
    errors += _check_zbus(config)
    errors += _check_socket_paths(config)
    return errors


def split_host_port(value: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as a host and a port; ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT with a port from 1 to 65535")
    return host.strip("[]"), int(port)


def _check_zbus(config: Config) -> list[tuple[str, str]]:
    """ZbusListen's address, its keys (a TCP peer has no credentials, so every
    request there is signed), and each key's ApiKey and User."""
    errors = []
    if config.zbus_listen is not None:
        try:
            split_host_port(config.zbus_listen)
        except ValueError as exc:
            errors.append((".ZbusListen", str(exc)))
        if not config.zbus_keys:
            errors.append((".ZbusListen", "needs ZbusKeys: every request on it but ping must be signed"))
    seen: set[str] = set()
    for i, key in enumerate(config.zbus_keys):
        if not key.api_key or key.api_key in seen:
            errors.append((f".ZbusKeys[{i}].ApiKey", "must be set and not repeat another key's"))
        seen.add(key.api_key)
        if not key.secret:
            errors.append((f".ZbusKeys[{i}].Secret", "must not be empty"))
        if isinstance(key.user, str) and not key.user.isdigit():
            try:
                pwd.getpwnam(key.user)
            except KeyError:
                errors.append((f".ZbusKeys[{i}].User", f"no such user {key.user!r}"))
    return errors


def _check_socket_paths(config: Config) -> list[tuple[str, str]]:
    """A socket path that holds something other than a socket (PROTOCOL §1): the
    broker, the subscriber kit and `ppmq listen` refuse to bind there, so the
    config is refused before any of them tries."""
    paths = [(".ServerSocket", config.server_socket), (".PhpmqSocket", config.phpmq_socket), (".ZbusSocket", config.zbus_socket)]
    paths += [(f".Subscribers[{i}].Socket", sub.socket) for i, sub in enumerate(config.subscribers)]
    errors = []
    for where, path in paths:
        what = sockets.occupant(path) if path is not None else None
        if what is not None:
            errors.append((where, f"{path} is {what}, not a socket; only a stale socket there is replaced"))
    return errors


def _check_delivery(sub: SubscriberConfig) -> list[tuple[str, str]]:
    """A subscriber is pushed to through its Socket, or pulls (PROTOCOL §9): one of the two."""
    errors = []
    if sub.pull and sub.socket is not None:
        errors.append((".Socket", "a Pull subscriber takes its messages and has no Socket"))
    elif not sub.pull and sub.socket is None:
        errors.append((".Socket", "required (or Pull: true, for a subscriber that takes its messages)"))
    elif sub.socket is not None and len(sub.socket.encode()) > _UNIX_PATH_MAX:
        errors.append((".Socket", f"path longer than {_UNIX_PATH_MAX} bytes"))
    if sub.connections < 1:
        errors.append((".Connections", f"must be at least 1, got {sub.connections}"))
    elif sub.connections > 1 and sub.pull:
        errors.append((".Connections", "is for push subscribers; a Pull subscriber's workers open their own"))
    return errors


def _check_metrics(metrics: MetricsConfig) -> list[tuple[str, str]]:
    """The textfile's directory must exist and be writable by whoever loads the
    config, so that a broker that cannot write its metrics does not start: the
    file is replaced by a rename, so the directory is what needs the right."""
    errors = []
    if metrics.interval <= 0:
        errors.append((".Interval", f"must be positive, got {metrics.interval:g}s"))
    folder = os.path.dirname(metrics.textfile)
    if not os.path.isdir(folder):
        errors.append((".Textfile", f"directory {folder} does not exist"))
    elif not os.access(folder, os.W_OK | os.X_OK):
        errors.append((".Textfile", f"directory {folder} is not writable by uid {os.geteuid()}"))
    elif os.path.isdir(metrics.textfile):
        errors.append((".Textfile", f"{metrics.textfile} is a directory"))
    return errors


def _check_limits(config: Config, topic: TopicConfig) -> list[tuple[str, str]]:
    """Per-topic limits and dead-lettering; a DeadLetter chain must not come back."""
    errors = []
    if topic.max_messages < 0:
        errors.append((".MaxMessages", f"must not be negative, got {topic.max_messages}"))
    if topic.overflow_policy not in OVERFLOW_POLICIES:
        errors.append((".OverflowPolicy", f"must be one of {', '.join(OVERFLOW_POLICIES)}, got {topic.overflow_policy!r}"))
    if topic.max_attempts < 0:
        errors.append((".MaxAttempts", f"must not be negative, got {topic.max_attempts}"))
    for i, reason in enumerate(topic.dead_letter_reasons):
        if reason not in DEAD_LETTER_REASONS:
            errors.append((f".DeadLetterReasons[{i}]", f"must be one of {', '.join(DEAD_LETTER_REASONS)}, got {reason!r}"))
    pullers = {s.name for s in config.subscribers if s.pull}
    if topic.phpmq_subscriber is not None and (topic.phpmq_subscriber not in topic.subscribers or topic.phpmq_subscriber not in pullers):
        errors.append((".PhpmqSubscriber", f"{topic.phpmq_subscriber!r} is not a Pull subscriber of this topic"))
    if topic.phpmq_dispatch_ttl and topic.phpmq_subscriber is None:
        errors.append((".PhpmqDispatchTTL", "needs PhpmqSubscriber (only PHPMQ consumers get dispatches)"))
    if topic.max_age is not None and not topic.expire:
        errors.append((".MaxAge", "needs Expire: true (without it, Expires is ignored)"))
    elif topic.max_age is not None and topic.max_age <= 0:
        errors.append((".MaxAge", f"must be positive, got {topic.max_age:g}s"))
    topics = {t.name: t for t in config.topics}
    seen, target = {topic.name}, topic.dead_letter
    while target is not None:
        if target not in topics:
            errors.append((".DeadLetter", f"unknown topic {target!r}"))
            break
        if target in seen:
            errors.append((".DeadLetter", f"leads back to topic {target!r}"))
            break
        seen.add(target)
        target = topics[target].dead_letter
    return errors


def _locate(path: Path, root: yaml.Node | None, where: str, msg: str) -> str:
    """`file:line: Key.Path: message`, with the line of the deepest node that exists."""
    steps = re.findall(r"\.([^.\[]+)|\[(\d+)\]", where)
    node, line, names = root, 1, []
    for key, index in steps:
        names.append(key if key else f"[{index}]")
        node = _child(node, key, index)
        if node is None:
            break
        line = node.start_mark.line + 1
    unknown = re.search(r"unknown field `([^`]+)`", msg)
    if unknown and node is not None:
        names.append(unknown[1])
        key_node = _key_node(node, unknown[1])
        line = key_node.start_mark.line + 1 if key_node is not None else line
        msg = "unknown key" + msg[unknown.end() :]
    label = ".".join(names).replace(".[", "[")
    return f"{path}:{line}: {label}: {msg}" if label else f"{path}:{line}: {msg}"


def _key_node(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        return next((k for k, _ in node.value if k.value == key), None)
    return None


def _child(node: yaml.Node | None, key: str, index: str) -> yaml.Node | None:
    if key and isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if k.value == key:
                return v
        return None
    if index and isinstance(node, yaml.SequenceNode):
        i = int(index)
        return node.value[i] if i < len(node.value) else None
    return None


def _resolved(config: Config, base: Path) -> Config:
    """Make relative paths relative to the config file's directory."""

    def absolute(p: str) -> str:
        return p if os.path.isabs(p) else os.path.normpath(base.resolve() / p)

    config.server_socket = absolute(config.server_socket)
    if config.phpmq_socket is not None:
        config.phpmq_socket = absolute(config.phpmq_socket)
    if config.zbus_socket is not None:
        config.zbus_socket = absolute(config.zbus_socket)
    if not config.in_memory:
        config.data_path = absolute(config.data_path)
    for sub in config.subscribers:
        if sub.socket is not None:
            sub.socket = absolute(sub.socket)
    if config.metrics is not None:
        config.metrics.textfile = absolute(config.metrics.textfile)
    return config


def default_config_path() -> str:
    """`-c` defaults to $PPMQ_CONFIG, then /etc/ppmq/ppmq.yaml (PROTOCOL §7)."""
    return os.environ.get("PPMQ_CONFIG") or "/etc/ppmq/ppmq.yaml"
