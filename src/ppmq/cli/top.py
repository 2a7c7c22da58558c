"""`ppmq top`: a live view of every topic and subscriber, as `htop` or `nats top`
give one, refreshed in place in a terminal; a plain table printed again each
interval when standard output is not a terminal, or with -n.

Everything shown comes from STATUS (PROTOCOL §4). A rate is the change of a
counter between two replies over the time between them: publishes from a
topic's Published, deliveries and acks from a subscriber's Delivered and Acked.
The rest (ready by priority, in flight, the oldest ready message's age,
connected, paused) is the latest reply's. The screen is drawn with curses, which
knows the terminal from TERM, so the view works over SSH as well as locally.
"""

from __future__ import annotations

import argparse
import curses
import locale
import os
import shutil
import sys
import time
from dataclasses import dataclass

from ppmq.cli.control import Command, align, duration, examples, open_client, positive
from ppmq.client.library import Client
from ppmq.client.results import Status, SubscriberStatus
from ppmq.errors import ClientError, ConfigError

MIN_INTERVAL_S = 0.1  # shorter would mostly measure the view's own STATUS requests
NAME_MIN = 12  # characters of a name kept when a narrow terminal cuts the column
HEADER = ("TOPIC/SUB", "PUB/s", "DELIV/s", "ACK/s", "READY", "INFLIGHT", "OLDEST", "CONN", "PAUSED")
READY = HEADER.index("READY")
KEYS = "q quits, arrows and PgUp/PgDn scroll"

EXAMPLE = examples(
    "ppmq top                          # live, every second; q quits",
    "ppmq top --interval 5s",
    "ppmq top -n 3 --interval 10s     # three tables, 10 s apart, then exit",
    "ppmq top | tee top.log           # not a terminal: a table each interval",
)
EXAMPLE += """

columns: TOPIC/SUB: each topic, with its subscribers indented under it; PUB/s, DELIV/s, ACK/s:
publishes to the topic, deliveries and acks of the subscriber, per second over the last interval
('-' until two replies were seen; a topic's line: its subscribers' together); READY: by priority,
0 first (a topic's line: the sum); INFLIGHT; OLDEST: the age of the oldest ready message; CONN:
a connection to the subscriber's socket, or a taker; PAUSED: by `ppmq pause`."""


def add_command(command: Command) -> None:
    top = command("top", _top, "a live view of every topic and subscriber: rates, queues, in flight, connected, paused", EXAMPLE)
    top.add_argument(
        "-i",
        "--interval",
        type=_interval,
        default=1.0,
        metavar="DURATION",
        help=f'time between refreshes: "2s", "500ms" or seconds, at least {MIN_INTERVAL_S:g}s (default 1s)',
    )
    top.add_argument(
        "-n",
        "--count",
        type=positive,
        metavar="N",
        help="print N plain tables, one each interval, then exit (the plain mode even on a terminal)",
    )


def _interval(text: str) -> float:
    value = duration(text)
    if value < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"at least {MIN_INTERVAL_S:g}s: {text!r}")
    return value


# --- what is shown -------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """A STATUS reply and when it came (time.monotonic)."""

    at: float
    status: Status


def sample(client: Client) -> Sample:
    status = client.status()
    return Sample(time.monotonic(), status)


def rate(now: int, before: int | None, seconds: float) -> str:
    """A counter's change per second; '-' without an earlier value. A counter that
    went down (a topic removed and added again) counts from zero."""
    if before is None or seconds <= 0:
        return "-"
    per_s = max(now - before if now >= before else now, 0) / seconds
    if per_s >= 10_000:
        return f"{per_s / 1000:.0f}k"
    return f"{per_s:.1f}" if per_s < 100 else f"{per_s:.0f}"


def age(seconds: float | None) -> str:
    """The oldest ready message's age, short: 0.4s, 42s, 5m03s, 2h10m; '-' when none is ready."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def rows(before: Sample | None, now: Sample) -> list[tuple[str, ...]]:
    """The table's rows under HEADER: each topic, then its subscribers indented."""
    seconds = now.at - before.at if before is not None else 0.0
    earlier = before.status.topics if before is not None else {}
    out: list[tuple[str, ...]] = []
    for name, topic in now.status.topics.items():
        old = earlier.get(name)
        subs = topic.subscribers
        old_subs: dict[str, SubscriberStatus] = old.subscribers if old is not None else {}
        ages = [s.oldest_ready_age for s in subs.values() if s.oldest_ready_age is not None]
        out.append(
            (
                name,
                rate(topic.published, old.published if old is not None else None, seconds),
                rate(_total(subs, "delivered"), _total(old_subs, "delivered") if old is not None else None, seconds),
                rate(_total(subs, "acked"), _total(old_subs, "acked") if old is not None else None, seconds),
                str(sum(sum(s.ready) for s in subs.values())),
                str(sum(s.in_flight for s in subs.values())),
                age(max(ages) if ages else None),
                "",
                "",
            )
        )
        for sub, s in subs.items():
            was = old_subs.get(sub)
            out.append(
                (
                    "  " + sub,
                    "",
                    rate(s.delivered, was.delivered if was is not None else None, seconds),
                    rate(s.acked, was.acked if was is not None else None, seconds),
                    "/".join(map(str, s.ready)),
                    str(s.in_flight),
                    age(s.oldest_ready_age),
                    "yes" if s.connected else "no",
                    "yes" if s.paused else "",
                )
            )
    return out


def _total(subs: dict[str, SubscriberStatus], counter: str) -> int:
    """A counter summed over a topic's subscribers."""
    return sum(getattr(s, counter) for s in subs.values())


def table(before: Sample | None, now: Sample, width: int | None) -> list[str]:
    """HEADER and the rows, aligned. With a `width`, a line is made to fit in it:
    names are cut first, down to NAME_MIN characters, then READY, whose first
    priorities are kept (the ones delivered first); the counts stay whole."""
    rows_ = [HEADER, *rows(before, now)]
    if width is not None:
        widths = [max(len(row[i]) for row in rows_) for i in range(len(HEADER))]
        room = width - (sum(widths) - widths[0]) - 2 * (len(HEADER) - 1)
        ready = widths[READY] - max(min(widths[0], NAME_MIN) - room, 0)
        name = max(room, NAME_MIN)
        rows_ = [(_cut(row[0], name), *row[1:READY], _cut(row[READY], max(ready, len(HEADER[READY]))), *row[READY + 1 :]) for row in rows_]
    return align(rows_)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def summary(before: Sample | None, now: Sample) -> str:
    """The line above the table: the store's use, commits per second and refused requests."""
    s = now.status
    commits = rate(s.commits, before.status.commits if before is not None else None, now.at - before.at if before else 0.0)
    return f"store {_size(s.store_used_bytes)} of {_size(s.store_max_bytes)}, commits/s {commits}, rejected {s.rejected}"


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _title(args: argparse.Namespace) -> str:
    return f"ppmq top, every {args.interval:g}s, {time.strftime('%H:%M:%S')}"


# --- the command ---------------------------------------------------------------------


def _top(args: argparse.Namespace) -> int:
    """The live view on a terminal, the plain tables otherwise (or with -n). Ctrl-C
    ends either as q does: stopping is how a view is left, not a failure."""
    try:
        if args.count is None and sys.stdout.isatty() and sys.stdin.isatty():
            try:
                return _live(args)
            except curses.error as exc:  # no screen to draw on
                print(f"ppmq top: cannot draw on this terminal ({exc}); printing tables instead", file=sys.stderr)
        return _plain(args)
    except KeyboardInterrupt:
        return 0


def _plain(args: argparse.Namespace) -> int:
    """A table each interval, after the first interval so that every table has rates;
    on a terminal, cut to its width as the live view is. A reader that goes away
    (`| head`) ends the command quietly."""
    width = shutil.get_terminal_size().columns - 1 if sys.stdout.isatty() else None  # a file keeps whole names
    with open_client(args) as client:
        before = sample(client)
        printed = 0
        while args.count is None or printed < args.count:
            time.sleep(max(before.at + args.interval - time.monotonic(), 0.0))
            now = sample(client)
            lines = [_title(args) + ": " + summary(before, now), *table(before, now, width)]
            try:
                sys.stdout.write("\n".join(lines) + "\n\n")
                sys.stdout.flush()
            except BrokenPipeError:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
            printed += 1
            before = now
    return 0


def _live(args: argparse.Namespace) -> int:
    curses.setupterm()  # from TERM: unset or unknown raises curses.error
    if curses.tigetstr("cup") is None:  # TERM=dumb, an editor's shell buffer: nothing can be drawn in place
        raise curses.error("it cannot move the cursor")
    client = open_client(args)  # before the screen is taken: a broker that is not there is an error as for any command
    locale.setlocale(locale.LC_ALL, "")  # for curses to write names in the terminal's encoding
    view = _Screen(args, client)
    try:
        return curses.wrapper(view.run)
    finally:
        view.close(view.client)


class _Screen:
    """The live view: a STATUS every interval, a key read in between. A broker that
    stops answering is shown as such, and asked again each interval until it does."""

    def __init__(self, args: argparse.Namespace, client: Client) -> None:
        self.args = args
        self.client: Client | None = client
        self.before: Sample | None = None
        self.now: Sample | None = None
        self.error: str | None = None
        self.offset = 0  # rows of the table scrolled past

    def run(self, screen: curses.window) -> int:
        try:
            curses.curs_set(0)
        except curses.error:  # a terminal that cannot hide its cursor shows it
            pass
        due = time.monotonic()
        while True:
            if time.monotonic() >= due:
                self.refresh()
                due = time.monotonic() + self.args.interval
            self.draw(screen)
            screen.timeout(max(int((due - time.monotonic()) * 1000), 0))
            key = screen.getch()
            if key in (ord("q"), ord("Q")):
                return 0
            self.scroll(key, screen.getmaxyx()[0])

    def refresh(self) -> None:
        try:
            if self.client is None:
                self.client = open_client(self.args)
            now = sample(self.client)
        except (ClientError, ConfigError) as exc:
            self.error = str(exc)
            self.close(self.client)
            self.client, self.before, self.now = None, None, None
            return
        self.error = None
        self.before, self.now = self.now, now

    def scroll(self, key: int, height: int) -> None:
        page = max(height - 4, 1)
        moves = {curses.KEY_UP: -1, ord("k"): -1, curses.KEY_DOWN: 1, ord("j"): 1, curses.KEY_PPAGE: -page, curses.KEY_NPAGE: page}
        if key in moves:
            self.offset = max(self.offset + moves[key], 0)
        elif key == curses.KEY_HOME:
            self.offset = 0

    def draw(self, screen: curses.window) -> None:
        height, width = screen.getmaxyx()
        keys = KEYS
        screen.erase()
        _put(screen, 0, _title(self.args), curses.A_BOLD)
        if self.now is None:
            _put(screen, 1, f"broker: {self.error}" if self.error else "asking the broker...")
        else:
            _put(screen, 1, summary(self.before, self.now))
            header, *body = table(self.before, self.now, width - 1)
            _put(screen, 2, header.ljust(width - 1), curses.A_REVERSE)
            shown = max(height - 4, 0)
            self.offset = min(self.offset, max(len(body) - shown, 0))
            for y, line in enumerate(body[self.offset : self.offset + shown], 3):
                _put(screen, y, line)
            if not body:
                _put(screen, 3, "no topics")
            if len(body) > shown:
                keys += f"; rows {self.offset + 1}-{min(self.offset + shown, len(body))} of {len(body)}"
        _put(screen, height - 1, keys, curses.A_DIM)
        screen.refresh()

    @staticmethod
    def close(client: Client | None) -> None:
        if client is not None:
            client.close()


def _put(screen: curses.window, y: int, text: str, attr: int = curses.A_NORMAL) -> None:
    """Text on line y, cut to the screen's width; a line below the screen is left out.
    The last column stays empty: writing there moves the cursor past the screen."""
    height, width = screen.getmaxyx()
    if 0 <= y < height and width > 1:
        try:
            screen.addnstr(y, 0, text, width - 1, attr)
        except UnicodeEncodeError:  # a name the terminal's encoding cannot show
            _put(screen, y, text.encode("ascii", "replace").decode(), attr)
        except curses.error:  # a line cut in the middle of a wide character
            pass
