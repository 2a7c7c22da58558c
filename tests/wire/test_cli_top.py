"""`ppmq top` against a real broker with traffic: the live view in a real terminal
(tmux, 80 columns by 24 lines, read back with capture-pane), and the plain tables
it prints when standard output is a pipe."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import wait_for
from .test_cli import ENV, PPMQ, ppmq

TOPICS = [{"Name": "jobs", "Priorities": 3, "Subscribers": ["worker", "idle"]}]
# A subscriber's line: name, deliveries/s, acks/s, ready by priority, in flight, oldest, connected, paused
SUB_LINE = r"^  {name}\s+(?P<deliv>[\d.]+k?)\s+(?P<ack>[\d.]+k?)\s+(?P<ready>\d+/[\d/]*…?)\s+(?P<inflight>\d+)\s+(?P<oldest>\S+)\s+(?P<conn>yes|no)(?:\s+(?P<paused>yes))?\s*$"
TOPIC_LINE = r"^jobs\s+(?P<pub>[\d.]+k?)\s+"


@pytest.fixture
def busy(broker_factory) -> Iterator:
    """A broker whose topic `jobs` takes 20 messages every 50 ms, pushed to `worker`,
    which acks them, and kept for `idle`, which nobody listens for and is paused."""
    b = broker_factory(TOPICS, ["worker", "idle"])
    broker_factory.subscriber(b, "worker")
    with b.client() as c:
        c.pause("idle")
    stop = threading.Event()

    def publish() -> None:
        with b.client() as c:
            for _ in range(1200):  # a minute at most
                c.publish("jobs", [{"Payload": i, "Priority": i % 3} for i in range(20)])
                if stop.wait(0.05):
                    return

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    yield b
    stop.set()
    thread.join()


class Tmux:
    """A tmux server of the test's own (its own socket), with one 80x24 window."""

    def __init__(self, tmp: Path) -> None:
        self.socket = str(tmp / "tmux.sock")
        self.status_path = tmp / "exit-status"

    def __call__(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=10)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, command: list[str], term: str = "xterm-256color") -> None:
        """Run `command` in a new 80x24 window; its exit status goes to a file when it ends
        (the shell that writes it outlives a Ctrl-C, which its trap takes)."""
        env = [f"PYTHONPATH={os.pathsep.join(sys.path)}", f"TERM={term}"]
        wrapped = ["sh", "-c", 'trap : INT; "$@"; echo $? > "$0"', str(self.status_path), "env", *env, *command]
        self("-f", "/dev/null", "new-session", "-d", "-x", "80", "-y", "24", "-s", "top", *wrapped)

    def exit_status(self) -> str:
        """The command's exit status once it has ended, else ''."""
        return self.status_path.read_text().strip() if self.status_path.exists() else ""

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def showing(self, text: str) -> str | None:
        """The screen, if `text` is on it."""
        screen = self.screen()
        return screen if text in screen else None

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def tmux(short_tmp: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    t = Tmux(short_tmp)
    yield t
    t.kill()


def test_top_shows_rates_and_counts_live_in_an_80_column_terminal_and_q_quits(busy, tmux):
    # Given ppmq top in a terminal of 80 columns, refreshing every 0.3 s
    tmux.start([*PPMQ, "top", "-c", str(busy.config_path), "--interval", "0.3s"])

    # Then the screen shows the topic's publish rate and the worker's delivery and ack
    # rates, all above zero, and idle's queue waiting, not connected, paused
    last = [""]

    def shown() -> tuple[str, re.Match, re.Match, re.Match] | None:
        screen = last[0] = tmux.screen()
        topic = re.search(TOPIC_LINE, screen, re.M)
        worker = re.search(SUB_LINE.format(name="worker"), screen, re.M)
        idle = re.search(SUB_LINE.format(name="idle"), screen, re.M)
        if topic and worker and idle and float(topic["pub"].rstrip("k")) > 0 and float(worker["ack"].rstrip("k")) > 0:
            return screen, topic, worker, idle
        return None

    try:
        screen, topic, worker, idle = wait_for(shown, what="rates above zero on the screen")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen:\n{last[0]}") from None
    assert float(worker["deliv"].rstrip("k")) > 0, screen
    assert int(idle["ready"].split("/")[0]) > 0 and idle["oldest"] != "-", screen
    assert (idle["conn"], idle["paused"]) == ("no", "yes"), screen
    assert worker["conn"] == "yes" and worker["paused"] is None, screen
    # And every column fits: the header's last one is whole, the keys are on the last line
    lines = screen.splitlines()
    assert any(re.match(r"^TOPIC/SUB\s+PUB/s\s+DELIV/s\s+ACK/s\s+READY\s+INFLIGHT\s+OLDEST\s+CONN\s+PAUSED\s*$", line) for line in lines), (
        screen
    )
    assert lines[0].startswith("ppmq top, every 0.3s")
    assert "q quits" in screen
    # And the screen is drawn in place: one view, not one printed after another
    assert screen.count("TOPIC/SUB") == 1

    # When q is typed, the command ends, exit status 0
    tmux("send-keys", "-t", "top", "q")
    assert wait_for(tmux.exit_status, what="ppmq top to exit after q") == "0"


def test_top_says_when_the_broker_stops_answering_and_shows_it_again_once_back(broker_factory, tmux):
    # Given the live view of a running broker
    broker = broker_factory(TOPICS, ["worker", "idle"])
    tmux.start([*PPMQ, "top", "-c", str(broker.config_path), "--interval", "0.2s"])
    wait_for(lambda: "worker" in tmux.screen(), what="the view")
    # When the broker stops, the view says so and keeps running
    broker.stop()
    wait_for(lambda: "broker: " in tmux.screen(), what="the view to say the broker is gone")
    assert tmux.exit_status() == ""
    # And once the broker is back, the view is again
    broker.start()
    wait_for(lambda: "worker" in tmux.screen(), what="the view to come back")
    tmux("send-keys", "-t", "top", "q")
    assert wait_for(tmux.exit_status, what="ppmq top to exit after q") == "0"


def tables(text: str) -> list[str]:
    return [t for t in text.split("\n\n") if t.strip()]


def test_top_piped_prints_a_plain_table_each_interval(busy):
    # When ppmq top writes to a pipe, twice
    r = ppmq("top", "-c", busy.config_path, "--interval", "0.2", "-n", "2")
    # Then it prints two tables and exits 0, with no terminal control sequences
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    got = tables(r.stdout)
    assert len(got) == 2, r.stdout
    for t in got:
        assert re.match(r"^ppmq top, every 0.2s, \d\d:\d\d:\d\d: store .* commits/s [\d.]+k?, rejected 0$", t.splitlines()[0]), t
        assert t.splitlines()[1].split() == [
            "TOPIC/SUB",
            "PUB/s",
            "DELIV/s",
            "ACK/s",
            "READY",
            "INFLIGHT",
            "OLDEST",
            "CONN",
            "PAUSED",
        ]
        # each table has rates: its counters were compared with the previous reply's
        assert float(re.search(TOPIC_LINE, t, re.M)["pub"].rstrip("k")) > 0, t
        idle = re.search(SUB_LINE.format(name="idle"), t, re.M)
        assert idle is not None and (idle["conn"], idle["paused"]) == ("no", "yes"), t


def test_top_piped_without_count_goes_on_until_the_reader_leaves(busy):
    # Given ppmq top writing to a pipe, with no count
    proc = subprocess.Popen([*PPMQ, "top", "-c", str(busy.config_path), "-i", "0.1"], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        # Then a table comes each interval
        for _ in range(3):
            assert proc.stdout.readline().startswith("ppmq top, every 0.1s")
            while proc.stdout.readline().strip():
                pass
        # And closing the pipe ends it quietly
        proc.stdout.close()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_top_without_a_broker_fails_as_other_commands_do(tmp_path):
    r = ppmq("top", "-s", str(tmp_path / "none.sock"), "-n", "1")
    assert r.returncode == 1
    assert r.stderr.startswith("ppmq top: cannot connect to"), r.stderr


@pytest.mark.parametrize("interval", ["0", "0.05", "-1", "soon"])
def test_top_refuses_an_interval_too_short_or_not_a_duration(interval):
    r = ppmq("top", "-s", "/nonexistent.sock", "--interval", interval)
    assert r.returncode == 2
    assert "argument -i/--interval" in r.stderr


def test_top_scrolls_a_table_longer_than_the_terminal(broker_factory, tmux):
    # Given 30 subscribers, more lines than the 24 of the terminal
    names = [f"s{i:02d}" for i in range(30)]
    broker = broker_factory([{"Name": "jobs", "Subscribers": names}], names)
    tmux.start([*PPMQ, "top", "-c", str(broker.config_path), "--interval", "0.2s"])
    # Then the last line says which rows are shown, from the first
    screen = wait_for(lambda: tmux.showing("rows 1-20 of 31"), what="the rows shown")
    assert re.search(r"^  s00\s", screen, re.M) and not re.search(r"^  s20\s", screen, re.M), screen
    # When the down arrow is typed twice, the table moves two rows up
    tmux("send-keys", "-t", "top", "Down", "Down")
    screen = wait_for(lambda: tmux.showing("rows 3-22 of 31"), what="the table to scroll")
    assert re.search(r"^  s20\s", screen, re.M) and not re.search(r"^jobs\s", screen, re.M), screen
    tmux("send-keys", "-t", "top", "q")
    assert wait_for(tmux.exit_status, what="ppmq top to exit after q") == "0"


def test_top_on_a_terminal_that_cannot_move_its_cursor_prints_tables_cut_to_its_width(broker_factory, tmux):
    # Given a terminal that says it is dumb, and a subscriber with a long name
    long = "a-subscriber-with-a-name-longer-than-the-terminal-has-room-for"
    broker = broker_factory([{"Name": "jobs", "Subscribers": [long]}], [long])
    tmux.start([*PPMQ, "top", "-c", str(broker.config_path), "--interval", "0.2s"], term="dumb")
    # Then ppmq top says so and prints tables one after the other, each line within 80 columns
    screen = wait_for(lambda: tmux.showing("ppmq top: cannot draw on this terminal"), what="the fallback")
    screen = wait_for(lambda: s if (s := tmux.screen()).count("TOPIC/SUB") >= 2 else None, what="two tables")
    assert re.search(r"^  a-subscriber-w…\s+0\.0\s+0\.0\s+0\s+0\s+-\s+no\s*$", screen, re.M), screen
    # And Ctrl-C ends it, exit status 0
    tmux("send-keys", "-t", "top", "C-c")
    assert wait_for(tmux.exit_status, what="ppmq top to exit after Ctrl-C") == "0"
