"""YAML configuration: PROTOCOL §6."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ppmq.config import load_config, parse_config, parse_duration, parse_size
from ppmq.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "ppmq.example.yaml"
FILE = Path("/etc/ppmq/ppmq.yaml")
MiB = 2**20

# ppMQ's own sample config: it must load unchanged.
PPMQ_SAMPLE = """\
ServerSocket: /tmp/imunify/mq.sock
DataPath: /tmp/imunify/store
Subscribers:
  - Name: rt-aibolit
    Socket: /tmp/imunify/rt-aibolit.sock
    BatchSize: 100
  - Name: iptables-ips
    Socket: /tmp/imunify/iptables-ips.sock
Topics:
  - Name: filescan
    AckRetry: 0
    Dedupe: True
    Priorities: 2
    Expire: True
    Subscribers:
      - rt-aibolit
  - Name: ips
    AckRetry: 5m
    Dedupe: False
    Priorities: 1
    Expire: True
    Subscribers:
      - iptables-ips
"""


def config_text(top: str = "", sub: str = "", subs: str = "", topic: str = "", topics: str = "") -> str:
    """A small valid config, with extra lines at the top level, in subscriber `a`,
    after it in Subscribers, in topic `t`, and after it in Topics."""
    lines = [
        "ServerSocket: /run/ppmq/ppmq.sock",
        "DataPath: mem",
        top,
        "Subscribers:",
        "  - Name: a",
        "    Socket: /run/ppmq/a.sock",
        sub,
        subs,
        "Topics:",
        "  - Name: t",
        "    Subscribers: [a]",
        topic,
        topics,
    ]
    return "".join(line + "\n" for line in lines if line)


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, FILE)
    return info.value.errors


# --- files that load ---------------------------------------------------------------------


def test_the_example_config_loads():
    config = load_config(EXAMPLE)
    assert [s.name for s in config.subscribers] == ["printer", "archiver", "worker", "thumbnails", "triage"]
    assert [s.name for s in config.subscribers if s.pull] == ["worker", "thumbnails", "triage"]
    filescan = next(t for t in config.topics if t.name == "filescan")
    assert (filescan.ack_retry, filescan.dedupe, filescan.priorities, filescan.expire) == (300.0, True, 2, True)
    assert config.window(next(s for s in config.subscribers if s.name == "printer")) == 200
    assert config.max_store_bytes == 2**30


def test_ppmqs_own_sample_config_loads_unchanged():
    config = parse_config(PPMQ_SAMPLE, FILE)
    assert (config.server_socket, config.data_path) == ("/tmp/imunify/mq.sock", "/tmp/imunify/store")
    rt, ips = config.subscribers
    assert (rt.name, rt.socket, rt.batch_size) == ("rt-aibolit", "/tmp/imunify/rt-aibolit.sock", 100)
    assert (ips.name, ips.socket, ips.batch_size) == ("iptables-ips", "/tmp/imunify/iptables-ips.sock", 50)
    filescan, ips_topic = config.topics
    assert (filescan.name, filescan.ack_retry, filescan.dedupe, filescan.priorities, filescan.expire, filescan.subscribers) == (
        "filescan",
        0,
        True,
        2,
        True,
        ["rt-aibolit"],
    )
    assert (ips_topic.name, ips_topic.ack_retry, ips_topic.dedupe, ips_topic.priorities, ips_topic.expire, ips_topic.subscribers) == (
        "ips",
        300,
        False,
        1,
        True,
        ["iptables-ips"],
    )


def test_load_config_reads_the_file_it_is_given(tmp_path):
    path = tmp_path / "ppmq.yaml"
    path.write_text(PPMQ_SAMPLE)
    assert load_config(path) == parse_config(PPMQ_SAMPLE, path)


# --- defaults ------------------------------------------------------------------------------


def test_keys_left_out_take_their_documented_defaults():
    config = parse_config(config_text(), FILE)
    [sub], [topic] = config.subscribers, config.topics
    assert (sub.batch_size, sub.window, config.window(sub)) == (50, None, 50)
    assert (topic.ack_required, topic.ack_retry, topic.dedupe, topic.priorities, topic.expire) == (True, 0, False, 1, False)
    assert (config.sync, config.max_frame_bytes, config.retry_max) == (True, 16 * MiB, 5.0)


def test_phpmq_dispatches_have_three_packets_unless_a_topic_asks_for_the_ttl():
    subs = "  - Name: w\n    Pull: true"
    topics = "  - Name: q\n    Subscribers: [w]\n    PhpmqSubscriber: w\n    PhpmqDispatchTTL: true"
    config = parse_config(config_text(subs=subs, topics=topics), FILE)
    assert [t.phpmq_dispatch_ttl for t in config.topics] == [False, True]


@pytest.mark.parametrize(
    ("sub", "window"), [("    BatchSize: 100", 100), ("    BatchSize: 100\n    Window: 7", 7), ("    Window: 300", 300)]
)
def test_the_window_defaults_to_the_batch_size(sub, window):
    config = parse_config(config_text(sub=sub), FILE)
    assert config.window(next(s for s in config.subscribers if s.name == "a")) == window


def test_extension_keys_are_read_with_their_units():
    top = "Sync: false\nMaxFrameBytes: 1MiB\nMaxMessageBytes: 4096\nMaxStoreBytes: 4GB\nRetryMax: 250ms"
    config = parse_config(config_text(top=top, topic="    AckRetry: 1h30m\n    AckRequired: false"), FILE)
    assert (config.sync, config.max_frame_bytes, config.max_message_bytes, config.max_store_bytes) == (False, MiB, 4096, 4 * 10**9)
    assert config.retry_max == 0.25
    (topic,) = config.topics
    assert (topic.ack_retry, topic.ack_required) == (5400.0, False)


@pytest.mark.parametrize("priorities", [1, 256])
def test_priorities_at_the_ends_of_the_range_are_accepted(priorities):
    assert parse_config(config_text(topic=f"    Priorities: {priorities}"), FILE).topics[0].priorities == priorities


# --- durations and sizes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("90s", 90),
        ("5m", 300),
        ("1h30m", 5400),
        ("250ms", 0.25),
        ("1.5h", 5400),
        ("1m30s", 90),
        ("0", 0),
        ("0s", 0),
        ("2us", 2e-6),
        ("3ns", 3e-9),
        (90, 90),
        (1.5, 1.5),
        (0, 0),
    ],
)
def test_durations_are_go_style_strings_or_seconds(value, seconds):
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["5x", "-1s", "", "s", "5", "5 m", "1h 30m", "ms5", -1, True, None, [], "1.2.3s"])
def test_a_bad_duration_is_rejected(value):
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("16MiB", 16 * 2**20),
        ("4GB", 4 * 10**9),
        ("4GiB", 4 * 2**30),
        ("512K", 512_000),
        ("512KiB", 512 * 1024),
        ("1B", 1),
        ("100", 100),
        (16777216, 16777216),
        ("16mib", 16 * 2**20),
    ],
)
def test_sizes_are_bytes_or_strings_with_a_unit(value, size):
    assert parse_size(value) == size


@pytest.mark.parametrize("value", ["1.5GiB", "16XB", "MiB", "", "-1", 0, -5, True, 1.5, None])
def test_a_bad_size_is_rejected(value):
    with pytest.raises(ValueError):
        parse_size(value)


# --- errors name the file, the line and the key -----------------------------------------------

MARK = "# <-"  # the line an error must point at

# (config_text arguments, key path named, words in the message)
BAD_CONFIGS = {
    "unknown top-level key": (dict(top="Bogus: 1  # <-"), "Bogus", "unknown key"),
    "unknown subscriber key": (dict(sub="    Bogus: 1  # <-"), "Subscribers[0].Bogus", "unknown key"),
    "unknown topic key": (dict(topic="    Expires: true  # <-"), "Topics[0].Expires", "unknown key"),
    "wrong type, top level": (dict(top="Sync: maybe  # <-"), "Sync", "use true or false, not 'maybe'"),
    "wrong type, subscriber": (dict(sub="    BatchSize: many  # <-"), "Subscribers[0].BatchSize", "use a whole number, not 'many'"),
    "wrong type, topic": (dict(topic="    Priorities: [2]  # <-"), "Topics[0].Priorities", "use a whole number, not a list"),
    "bad duration, topic": (dict(topic="    AckRetry: 5x  # <-"), "Topics[0].AckRetry", "invalid duration"),
    "negative duration": (dict(top="RetryMax: -1s  # <-"), "RetryMax", "duration"),
    "bad size": (dict(top="MaxFrameBytes: 1.5GiB  # <-"), "MaxFrameBytes", "size"),
    "unknown subscriber in a topic": (
        dict(topics="  - Name: u\n    Subscribers:\n      - a\n      - nobody  # <-"),
        "Topics[1].Subscribers[1]",
        "unknown subscriber 'nobody'",
    ),
    "duplicate subscriber": (dict(subs="  - Name: a  # <-\n    Socket: /run/b.sock"), "Subscribers[1].Name", "duplicate name 'a'"),
    "duplicate topic": (dict(topics="  - Name: t  # <-"), "Topics[1].Name", "duplicate name 't'"),
    "Priorities 0": (dict(topic="    Priorities: 0  # <-"), "Topics[0].Priorities", "1..256"),
    "Priorities 257": (dict(topic="    Priorities: 257  # <-"), "Topics[0].Priorities", "1..256"),
    "BatchSize 0": (dict(sub="    BatchSize: 0  # <-"), "Subscribers[0].BatchSize", "at least 1"),
    "Window 0": (dict(sub="    Window: 0  # <-"), "Subscribers[0].Window", "at least 1"),
    "subscriber socket too long": (
        dict(subs=f"  - Name: b\n    Socket: /{'s' * 107}  # <-"),
        "Subscribers[1].Socket",
        "longer than 107 bytes",
    ),
    "PhpmqDispatchTTL without PhpmqSubscriber": (
        dict(topic="    PhpmqDispatchTTL: true  # <-"),
        "Topics[0].PhpmqDispatchTTL",
        "needs PhpmqSubscriber",
    ),
    "ZbusAck not a mode": (dict(sub="    ZbusAck: never  # <-"), "Subscribers[0].ZbusAck", "must be one of window, explicit, delivery"),
    "ZbusSocket too long": (dict(top=f"ZbusSocket: /{'z' * 107}  # <-"), "ZbusSocket", "longer than 107 bytes"),
    "ZbusListen without ZbusKeys": (dict(top="ZbusListen: 127.0.0.1:15555  # <-"), "ZbusListen", "needs ZbusKeys"),
    "ZbusListen not HOST:PORT": (
        dict(top="ZbusListen: localhost  # <-\nZbusKeys: [{ApiKey: k, Secret: s, User: root}]"),
        "ZbusListen",
        "is not HOST:PORT",
    ),
    "ZbusKeys with an unknown user": (
        dict(top="ZbusKeys:\n  - {ApiKey: k, Secret: s, User: nobody-here}  # <-"),
        "ZbusKeys[0].User",
        "no such user 'nobody-here'",
    ),
    "PhpmqDispatchTTL not a bool": (dict(topic="    PhpmqDispatchTTL: 4  # <-"), "Topics[0].PhpmqDispatchTTL", "use true or false, not 4"),
}


@pytest.mark.parametrize(("parts", "key", "words"), list(BAD_CONFIGS.values()), ids=list(BAD_CONFIGS))
def test_an_error_names_the_file_the_line_and_the_key(parts, key, words):
    # Given a config with one mistake, on the line marked "# <-"
    text = config_text(**parts)
    line = next(n for n, text_line in enumerate(text.splitlines(), 1) if MARK in text_line)
    # When it is loaded
    [error] = errors_of(text)
    # Then the one error reads FILE:LINE: Key.Path: message
    assert error.startswith(f"{FILE}:{line}: {key}: ")
    assert words in error


def test_a_server_socket_path_over_107_bytes_is_an_error():
    text = config_text().replace("/run/ppmq/ppmq.sock", "/" + "s" * 107)
    assert errors_of(text) == [f"{FILE}:1: ServerSocket: path longer than 107 bytes"]


def test_a_socket_path_of_107_bytes_is_accepted():
    path = "/" + "s" * 106
    assert parse_config(config_text().replace("/run/ppmq/a.sock", path), FILE).subscribers[0].socket == path


def test_every_problem_found_after_decoding_is_reported_at_once_in_the_order_of_the_lines():
    errors = errors_of(config_text(sub="    BatchSize: 0", topic="    Priorities: 0", topics="  - Name: t"))
    assert [e.split(": ")[1] for e in errors] == ["Subscribers[0].BatchSize", "Topics[0].Priorities", "Topics[1].Name"]


def test_every_problem_of_a_file_is_reported_at_once_in_its_words_with_the_checks_across_fields():
    # Given a file with type errors, misspelt keys and a cross-field problem, in every section
    text = config_text(
        top="Sync: 4\nJournal:\n  Enabled: 1\n  SegmentBytes: lots",
        sub="    BatchSize: 0\n    Pul: true",
        topic="    Priorites: 2\n    AckRetry: 5 minutes\n    Expire: yes please\n    MaxMessages: many",
        topics="  - Name: u\n    Subscribers: a\nbogus: 1",
    )
    # When it is loaded
    errors = errors_of(text)
    # Then each problem is named at its line, in the file's order, in the config's words
    lines = text.splitlines()
    assert errors == [
        f"{FILE}:{lines.index(line) + 1}: {message}"
        for line, message in [
            ("Sync: 4", "Sync: use true or false, not 4"),
            ("  Enabled: 1", "Journal.Enabled: use true or false, not 1"),
            ("  SegmentBytes: lots", """Journal.SegmentBytes: invalid size 'lots' (use e.g. 16777216, "16MiB", "4GB")"""),
            ("    BatchSize: 0", "Subscribers[0].BatchSize: must be at least 1, got 0"),
            ("    Pul: true", "Subscribers[0].Pul: unknown key; did you mean Pull?"),
            ("    Priorites: 2", "Topics[0].Priorites: unknown key; did you mean Priorities?"),
            ("    AckRetry: 5 minutes", """Topics[0].AckRetry: invalid duration '5 minutes' (use e.g. "90s", "5m", "1h30m", "250ms")"""),
            ("    Expire: yes please", "Topics[0].Expire: use true or false, not 'yes please'"),
            ("    MaxMessages: many", "Topics[0].MaxMessages: use a whole number, not 'many'"),
            ("    Subscribers: a", "Topics[1].Subscribers: use a list, such as [a, b], not 'a'"),
            ("bogus: 1", "bogus: unknown key"),
        ]
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("priorities: 2", "Topics[0].priorities: unknown key; did you mean Priorities?"),
        ("Metrics: 3", "Metrics: use a mapping of keys, not 3"),
        ("Dedup: true", "Topics[0].Dedup: unknown key; did you mean Dedupe?"),
        ("Publishers: {a: 1}", "Topics[0].Publishers: use a list, such as [a, b], not a mapping"),
    ],
)
def test_a_key_of_the_wrong_type_or_name_is_said_in_the_words_of_the_config(line, message):
    text = config_text(top=line) if line.startswith("Metrics") else config_text(topic="    " + line)
    [error] = errors_of(text)
    assert error.split(": ", 1)[1] == message


def test_a_required_key_of_the_wrong_type_is_reported_without_the_checks_it_would_mislead():
    # Given a topic whose Name is a list, and a Priorities out of range
    [error] = errors_of(config_text(topics="  - Name: [u]\n    Subscribers: [a]"))
    # Then the Name is the one problem named: the checks across fields need every name
    assert error.split(": ", 1)[1] == "Topics[1].Name: use a string, not a list"


def test_a_missing_required_key_is_named():
    [error] = errors_of("DataPath: mem\n")
    assert error.startswith(f"{FILE}:1: ") and "ServerSocket" in error


def test_an_unknown_key_with_a_block_value_is_reported_at_the_key():
    # The typo `Subscriber:` for `Subscribers:` is a likely one
    text = config_text(top="Subscriber:  # <-\n  - Name: x\n    Socket: /run/x.sock")
    assert errors_of(text) == [f"{FILE}:3: Subscriber: unknown key; did you mean Subscribers?"]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("ServerSocket: a\n  DataPath: b\n", 2),
        ("ServerSocket: /s\nDataPath: mem\nTopics:\n  - Name: [t\n", 5),
        ("ServerSocket: /s\n\tDataPath: mem\n", 2),
    ],
)
def test_invalid_yaml_is_an_error_with_its_line(text, line):
    [error] = errors_of(text)
    assert error.startswith(f"{FILE}:{line}: invalid YAML")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- a\n- b\n", "just a string\n", "42\n"])
def test_a_top_level_that_is_not_a_mapping_is_an_error(text):
    assert errors_of(text) == [f"{FILE}:1: the top level must be a mapping of keys such as ServerSocket"]


@pytest.mark.parametrize("make", ["missing", "directory", "not utf-8"])
def test_an_unreadable_file_is_an_error_naming_it(tmp_path, make):
    path = tmp_path / "ppmq.yaml"
    if make == "directory":
        path.mkdir()
    elif make == "not utf-8":
        path.write_bytes(b"ServerSocket: /s\xff\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    [error] = info.value.errors
    assert error.startswith(f"{path}: cannot read")


def test_errors_from_a_loaded_file_name_that_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(config_text(sub="    BatchSize: 0"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == [f"{path}:6: Subscribers[0].BatchSize: must be at least 1, got 0"]
    assert str(info.value) == info.value.errors[0]


# --- paths ----------------------------------------------------------------------------------------


def test_relative_paths_are_relative_to_the_config_files_directory_whatever_the_cwd(tmp_path, monkeypatch):
    # Given a config with relative paths in tmp/etc, and the process in another directory
    (tmp_path / "etc").mkdir()
    path = tmp_path / "etc" / "ppmq.yaml"
    path.write_text(
        "ServerSocket: ppmq.sock\nDataPath: ./data\n"
        "Subscribers:\n  - Name: a\n    Socket: ../run/a.sock\n  - Name: b\n    Socket: /abs/b.sock\n"
    )
    monkeypatch.chdir("/")
    # When it is loaded through a relative path
    config = load_config(os.path.relpath(path))
    # Then every relative path is absolute, under the config's directory
    etc = tmp_path.resolve() / "etc"
    assert config.server_socket == str(etc / "ppmq.sock")
    assert config.data_path == str(etc / "data")
    assert [s.socket for s in config.subscribers] == [str(tmp_path.resolve() / "run" / "a.sock"), "/abs/b.sock"]


def test_datapath_mem_stays_mem(tmp_path):
    path = tmp_path / "ppmq.yaml"
    path.write_text(config_text())
    config = load_config(path)
    assert (config.data_path, config.in_memory) == ("mem", True)


def test_a_relative_socket_path_that_resolves_past_107_bytes_is_an_error(tmp_path):
    # Given a config in a deep directory, with a short relative socket path
    deep = tmp_path / ("d" * max(1, 110 - len(str(tmp_path.resolve()))))
    deep.mkdir()
    path = deep / "ppmq.yaml"
    path.write_text(config_text().replace("/run/ppmq/a.sock", "a.sock"))
    assert len(str(deep.resolve() / "a.sock")) > 107
    # Then loading it names the socket, as an absolute path that long would be named
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == [f"{path}:5: Subscribers[0].Socket: path longer than 107 bytes"]


def test_metrics_take_a_textfile_relative_to_the_config_and_an_interval_as_a_duration(tmp_path):
    path = tmp_path / "ppmq.yaml"
    path.write_text(config_text(top="Metrics: {Textfile: ppmq.prom, Interval: 1m30s}"))
    metrics = load_config(path).metrics
    assert (metrics.textfile, metrics.interval) == (str(tmp_path.resolve() / "ppmq.prom"), 90.0)
    path.write_text(config_text(top="Metrics: {Textfile: ppmq.prom}"))
    assert load_config(path).metrics.interval == 15.0
    assert load_config(EXAMPLE).metrics is None  # off unless set


@pytest.mark.parametrize(
    ("metrics", "error"),
    [
        ("{Textfile: /tmp/ppmq.prom, Interval: 0}", "FILE:3: Metrics.Interval: must be positive, got 0s"),
        ("{Textfile: /tmp}", "FILE:3: Metrics.Textfile: /tmp is a directory"),
        ("{Interval: 15s}", "FILE:3: Metrics.Textfile: required, but missing"),
    ],
)
def test_bad_metrics_are_config_errors_naming_the_key(metrics, error):
    assert errors_of(config_text(top=f"Metrics: {metrics}")) == [error.replace("FILE", str(FILE))]
