"""What a socket path may hold (PROTOCOL §1): the broker, `ppmq listen` and the
subscriber kit replace only a stale socket there. A file, a directory or a
symbolic link is refused with an error naming it, by `ppmq check` too, and is
left as it was; a live socket is in use; a missing directory is not created;
and at stop a process removes only the socket file it bound itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ppmq.client import subscriber as kit
from ppmq.errors import ConfigError

from ..conftest import WAIT_S, make_config, wait_for
from .test_cli import ENV, PPMQ, ppmq

TOPICS = [{"Name": "t", "Subscribers": ["s"]}]


def regular_file(path: Path) -> Callable[[], bool]:
    path.write_text("important\n")
    return lambda: path.read_text() == "important\n"


def directory(path: Path) -> Callable[[], bool]:
    path.mkdir()
    (path / "inside").write_text("kept\n")
    return lambda: path.is_dir() and (path / "inside").read_text() == "kept\n"


def symlink(path: Path) -> Callable[[], bool]:
    target = path.with_name("target.txt")
    target.write_text("important\n")
    path.symlink_to(target)
    return lambda: path.is_symlink() and os.readlink(path) == str(target) and target.read_text() == "important\n"


OCCUPANTS = pytest.mark.parametrize(
    ("make", "kind"),
    [(regular_file, "a regular file"), (directory, "a directory"), (symlink, "a symbolic link")],
    ids=["regular file", "directory", "symbolic link"],
)


def live_listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    return sock


def stale_socket(path: Path) -> None:
    """What a process killed while listening leaves behind."""
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()


def accepts(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


# --- the broker and `ppmq check` ---------------------------------------------------------------


@OCCUPANTS
@pytest.mark.parametrize("key", ["ServerSocket", "PhpmqSocket", "Subscribers[0].Socket"])
def test_a_socket_path_that_holds_no_socket_fails_check_and_serve_naming_it_and_is_left_intact(short_tmp, make, kind, key):
    # Given a config whose socket path (ServerSocket, line 1; PhpmqSocket, line 3; the subscriber's, line 6) holds something else
    occupied = short_tmp / "important.txt"
    intact = make(occupied)
    paths = {
        "ServerSocket": short_tmp / "ppmq.sock",
        "PhpmqSocket": short_tmp / "phpmq.sock",
        "Subscribers[0].Socket": short_tmp / "s.sock",
    }
    paths[key] = occupied
    config = short_tmp / "ppmq.yaml"
    config.write_text(
        f"ServerSocket: {paths['ServerSocket']}\nDataPath: {short_tmp}/data\nPhpmqSocket: {paths['PhpmqSocket']}\n"
        f"Subscribers:\n  - Name: s\n    Socket: {paths['Subscribers[0].Socket']}\nTopics:\n  - Name: t\n    Subscribers: [s]\n"
    )
    line = {"ServerSocket": 1, "PhpmqSocket": 3, "Subscribers[0].Socket": 6}[key]
    # When it is checked, then check exits 1 naming the file, the line, the key and what is there
    r = ppmq("check", "-c", config)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"{config}:{line}: {key}: {occupied} is {kind}, not a socket" in r.stderr
    # And when the broker is started on it, it refuses likewise, having touched nothing
    r = ppmq("serve", "-c", config)
    assert r.returncode == 1, r.stderr
    assert f"{occupied} is {kind}, not a socket" in r.stderr and "Traceback" not in r.stderr
    assert intact()
    assert not (short_tmp / "data").exists()


def test_the_broker_replaces_a_stale_socket_at_its_paths(broker_factory, short_tmp):
    # Given stale sockets at ServerSocket and PhpmqSocket
    b = broker_factory(TOPICS, ["s"], start=False, PhpmqSocket=str(short_tmp / "phpmq.sock"))
    stale_socket(Path(b.socket))
    stale_socket(short_tmp / "phpmq.sock")
    # When the broker starts, then it listens on both
    b.start()
    wait_for(lambda: accepts(short_tmp / "phpmq.sock"), what="PhpmqSocket")
    assert b.status()["Topics"]


def test_a_phpmq_socket_another_process_listens_on_is_in_use_and_stays_after_the_broker_gives_up(broker_factory, short_tmp):
    # Given a live listener on PhpmqSocket
    phpmq_path = short_tmp / "phpmq.sock"
    other = live_listener(phpmq_path)
    try:
        b = broker_factory(TOPICS, ["s"], start=False, PhpmqSocket=str(phpmq_path))
        # When the broker starts
        r = ppmq("serve", "-c", b.config_path)
        # Then it refuses, and the other process's socket is still there and accepts
        assert r.returncode == 1, r.stderr
        assert f"another process is already listening on {phpmq_path}" in r.stderr
        assert accepts(phpmq_path)
    finally:
        other.close()


def test_a_broker_leaves_what_replaced_its_socket_at_stop(broker_factory, short_tmp):
    # Given a running broker whose ServerSocket path someone replaced with a file
    b = broker_factory(TOPICS, ["s"])
    replacement = short_tmp / "replacement"
    replacement.write_text("important\n")
    os.replace(replacement, b.socket)
    # When the broker stops
    assert b.stop() == 0
    # Then the file is still there, as it was
    assert Path(b.socket).read_text() == "important\n"
    assert "not removing" in b.log


def test_the_broker_does_not_create_a_missing_socket_directory(short_tmp):
    config = make_config(short_tmp, TOPICS, ["s"])
    config["ServerSocket"] = str(short_tmp / "missing" / "ppmq.sock")
    path = short_tmp / "c.yaml"
    path.write_text(json.dumps(config))
    r = ppmq("serve", "-c", path)
    assert r.returncode == 1
    assert f"cannot listen on {config['ServerSocket']}: directory {short_tmp / 'missing'} does not exist" in r.stderr
    assert not (short_tmp / "missing").exists()


# --- ppmq listen ---------------------------------------------------------------------------


@OCCUPANTS
def test_listen_refuses_a_path_that_holds_no_socket_and_leaves_it_intact(short_tmp, make, kind):
    occupied = short_tmp / "README.md"
    intact = make(occupied)
    r = ppmq("listen", occupied)
    assert r.returncode == 1
    assert f"cannot listen on {occupied}: it is {kind}, not a socket" in r.stderr
    assert intact()


def test_listen_refuses_a_missing_directory_and_does_not_create_it(short_tmp):
    r = ppmq("listen", short_tmp / "missing" / "dir" / "x.sock")
    assert r.returncode == 1
    assert f"directory {short_tmp / 'missing' / 'dir'} does not exist" in r.stderr
    assert not (short_tmp / "missing").exists()


def test_listen_refuses_a_socket_another_process_listens_on(short_tmp):
    other = live_listener(short_tmp / "live.sock")
    try:
        r = ppmq("listen", short_tmp / "live.sock")
        assert r.returncode == 1
        assert "already listening" in r.stderr
        assert accepts(short_tmp / "live.sock")
    finally:
        other.close()


def test_listen_replaces_a_stale_socket(short_tmp):
    path = short_tmp / "stale.sock"
    stale_socket(path)
    proc = subprocess.Popen([*PPMQ, "listen", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        wait_for(lambda: accepts(path), what="ppmq listen on the stale socket's path")
    finally:
        proc.terminate()
        proc.wait(WAIT_S)


# --- the subscriber kit ----------------------------------------------------------------------


SUBSCRIBER = "from ppmq.client.subscriber import main; raise SystemExit(main('s', lambda batch: None))"


def run_kit(path: Path, short_tmp: Path) -> subprocess.CompletedProcess:
    """A subscriber script run by hand with explicit paths: no config is read,
    only binding decides; one that binds runs on, and the timeout fails the test."""
    argv = [sys.executable, "-c", SUBSCRIBER, "--socket", str(path), "--server-socket", str(short_tmp / "no-broker.sock")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S, env=ENV)


@OCCUPANTS
def test_the_subscriber_kit_refuses_a_path_that_holds_no_socket_and_leaves_it_intact(short_tmp, make, kind):
    occupied = short_tmp / "s.sock"
    intact = make(occupied)
    r = run_kit(occupied, short_tmp)
    assert r.returncode == 1
    assert f"cannot listen on {occupied}: it is {kind}, not a socket" in r.stderr
    assert intact()


def test_the_subscriber_kit_refuses_a_missing_directory_and_does_not_create_it(short_tmp):
    r = run_kit(short_tmp / "missing" / "s.sock", short_tmp)
    assert r.returncode == 1
    assert f"directory {short_tmp / 'missing'} does not exist" in r.stderr
    assert not (short_tmp / "missing").exists()


def test_a_subscriber_config_socket_that_holds_no_socket_is_a_config_error_naming_it(broker_factory):
    b = broker_factory(TOPICS, ["s"], start=False)
    Path(b.sub_socket("s")).write_text("important\n")
    with pytest.raises(ConfigError, match=f"Subscribers\\[0\\].Socket: {b.sub_socket('s')} is a regular file, not a socket"):
        kit.settings("s", str(b.config_path))
    assert Path(b.sub_socket("s")).read_text() == "important\n"
