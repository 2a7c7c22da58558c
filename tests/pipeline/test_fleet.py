"""`ppmq report` on the journals of 50 hosts, written by `Journal` as brokers write
them: one row per host, a fleet summary naming the worst hosts, and a page whose
charts render in headless Chromium and whose host filter hides the other hosts."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from pyspark.sql import SparkSession

from ppmq.cli.main import main
from ppmq.core import events as ev
from ppmq.core.events import Event
from ppmq.pipeline.multiples import PANEL_H, PANEL_W
from ppmq.server.journal import Journal

NS = 1_000_000_000
T0 = 1_795_300_000 * NS
HOSTS = [f"h{i:02d}" for i in range(50)]
MINUTES = 5
BATCH = 10  # messages published per host in its busiest minute
REDELIVERED = 5  # of them, delivered again on every host whose number ends in 3
QUIET_MINUTE = 2  # hosts whose number ends in 5 publish nothing then
LATE = 1  # hosts whose number ends in 8 begin their journal at this minute
PANEL_COLOUR = (44, 160, 44)  # the ack line of a host's panel, drawn over the others, #2ca02c
BAR_COLOUR = (214, 39, 40)  # a top-N chart's bars, #d62728


def _ack_s(i: int) -> float:
    """Host i acks every message this long after its publish: h49 is the slowest."""
    return 0.01 * (i + 1)


def _active(i: int) -> list[int]:
    """The minutes host i publishes in: all, but a quiet one in the middle or a few at the start."""
    skipped = {QUIET_MINUTE} if i % 10 == 5 else set(range(LATE)) if i % 10 == 8 else set()
    return [m for m in range(MINUTES) if m not in skipped]


def _size(i: int, m: int) -> int:
    return BATCH - (m + i) % 5


def _minute(i: int, m: int) -> list[Event]:
    """One minute of host i: a publish of 6 to 10 messages (by host and minute, so that
    the panels differ), their delivery, maybe some redelivered, and their acks (ids
    only, as a broker writes them: the report joins them to the publish)."""
    ts, ids = T0 + m * 60 * NS, list(range(m * BATCH, m * BATCH + _size(i, m)))
    sent = {"topic": "orders", "subscriber": "worker", "pub_ns": [ts] * len(ids)}
    steps = [
        Event(
            event=ev.PUBLISH,
            ts=ts,
            topic="orders",
            ids=ids,
            prio=[0] * len(ids),
            bytes=[40] * len(ids),
            expires_ns=[0] * len(ids),
            replaced=[False] * len(ids),
        ),
        Event(event=ev.DELIVER, ts=ts + NS // 200, ids=ids, attempts=[1] * len(ids), bytes=[40] * len(ids), **sent),
    ]
    if i % 10 == 3:
        again = {**sent, "pub_ns": [ts] * REDELIVERED}
        steps.append(
            Event(event=ev.DELIVER, ts=ts + NS // 100, ids=ids[:REDELIVERED], attempts=[2] * REDELIVERED, bytes=[40] * REDELIVERED, **again)
        )
    return [*steps, Event(event=ev.ACK, ts=ts + int(_ack_s(i) * NS), topic="orders", subscriber="worker", ids=ids)]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of 50 hosts' journals, a directory per host."""
    base = tmp_path_factory.mktemp("fleet")
    for i, host in enumerate(HOSTS):
        journal = Journal(base / "journals" / host, 1 << 20, 1 << 30, host=host).start()
        for m in _active(i):
            for event in _minute(i, m):
                journal.put([event])
        journal.close()
    assert main(["report", str(base / "journals"), "--out", str(base / "out")]) == 0
    return base / "out"


def test_every_host_has_one_row_with_its_latency_and_redelivery_rate(spark: SparkSession, out: Path) -> None:
    hosts = {r["host"]: r.asDict() for r in spark.read.parquet(str(out / "hosts")).collect()}
    assert sorted(hosts) == HOSTS
    for i, host in enumerate(HOSTS):
        row = hosts[host]
        published = sum(_size(i, m) for m in _active(i))
        redelivered = len(_active(i)) * REDELIVERED if i % 10 == 3 else 0
        assert (row["published"], row["acked"], row["delivered"]) == (published, published, published + redelivered), host
        assert row["redelivery_rate"] == pytest.approx(redelivered / (published + redelivered)), host
        assert row["ack_p99_s"] == pytest.approx(_ack_s(i), rel=0.01), host


def test_per_minute_series_are_zero_filled_over_their_hosts_journal(spark: SparkSession, out: Path) -> None:
    """A quiet minute has rows of 0 messages; minutes before a host's journal begins have none."""
    series: dict[tuple[str, str], dict[int, int]] = {}
    for r in spark.read.parquet(str(out / "throughput")).collect():
        # minutes since T0's (collect() gives local time, as timestamp() reads it)
        minute = (round(r["minute"].timestamp()) - T0 // NS // 60 * 60) // 60
        series.setdefault((r["host"], r["event"]), {})[minute] = r["messages"]
    assert {event for _, event in series} == {"publish", "deliver", "ack"}
    for (host, event), counts in series.items():
        i = HOSTS.index(host)
        assert sorted(counts) == list(range(min(_active(i)), MINUTES)), (host, event)
        assert {m for m, n in counts.items() if n == 0} == ({QUIET_MINUTE} if i % 10 == 5 else set()), (host, event)


def test_a_hosts_panel_falls_to_zero_in_a_quiet_minute_and_begins_with_its_journal(out: Path) -> None:
    page = (out / "report.html").read_text()
    step = PANEL_W / (MINUTES - 1)
    for host, first, zero in (("h05", 0, QUIET_MINUTE), ("h08", LATE, None)):
        panel = re.search(rf'<figure class="multiple" data-host="{host}">.*?</figure>', page)
        assert panel is not None, host
        for line in re.findall(r'points="([^"]+)"', panel.group()):
            points = [tuple(map(float, p.split(","))) for p in line.split()]
            assert [x for x, _ in points] == [pytest.approx(m * step) for m in range(first, MINUTES)], host
            assert [m for m, (_, y) in zip(range(first, MINUTES), points) if y == PANEL_H - 2] == ([] if zero is None else [zero]), host


def _page(out: Path, fragment: str = "") -> str:
    """The page's DOM after its script ran, as headless Chromium dumps it."""
    return _chromium(out, fragment, "--dump-dom").stdout


def _screenshot(out: Path, tmp_path: Path, fragment: str = "") -> Image.Image:
    png = tmp_path / "page.png"
    _chromium(out, fragment, f"--screenshot={png}", "--window-size=1200,1400", "--hide-scrollbars")
    return Image.open(png).convert("RGB")


def _chromium(out: Path, fragment: str, *args: str, page: str = "report.html") -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on report.html (or another page in `out`); `make test` installs it."""
    browser = shutil.which("chromium") or pytest.skip("no chromium (make test installs it)")
    url = (out / page).resolve().as_uri() + fragment
    command = [
        browser,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--user-data-dir=" + str(out / ".chromium"),
        *args,
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def _count(image: Image.Image, colour: tuple[int, int, int]) -> int:
    """Pixels of about `colour`: lines are antialiased."""
    return sum(n for n, c in image.getcolors(1 << 24) if sum(abs(a - b) for a, b in zip(c, colour)) < 60)


def test_the_fleet_summary_names_the_worst_hosts(out: Path) -> None:
    page = _page(out)
    assert "h49, h48, h47" in page  # by ack p99
    assert "h03, h13, h23" in page  # by redelivery rate
    assert "showing 50 of 50 hosts" in page
    assert page.count('<figure class="multiple"') == 50
    assert "others (40), median" in page  # by ack p99
    assert "others (45), median" in page  # by redelivery rate: the 45 at 0 go unnamed


def test_the_charts_render_in_chromium(out: Path, tmp_path: Path) -> None:
    """The top-N bars show at the top of the page, and every host's panel draws its lines."""
    image = _screenshot(out, tmp_path)
    assert _count(image, BAR_COLOUR) > 1000
    panels = _screenshot(out, tmp_path, "#hosts=h0*")
    assert _count(panels, PANEL_COLOUR) > 10 * 200  # ten panels, each line at least as long as one is wide


# Run in the page once it has loaded: what a reader would have to scroll, written into the DOM.
MEASURE = """<script>
const boxes = [...document.querySelectorAll("div.table")];
const wide = boxes.filter(b => b.scrollWidth > b.clientWidth + 1);
document.body.insertAdjacentHTML("beforeend", `<pre id="measured">page ${document.documentElement.scrollWidth} window ${innerWidth} ` +
  `tables ${document.querySelectorAll("table").length} boxed ${boxes.length} scrolling ${wide.map(b => b.previousElementSibling?.textContent)}</pre>`);
</script>"""


def test_tables_fit_the_page_and_scroll_inside_it(out: Path, tmp_path: Path) -> None:
    """In a window narrower than the subscribers table, the page does not scroll sideways:
    the wide tables do, each inside its box."""
    measured = out / "measured.html"
    measured.write_text((out / "report.html").read_text().replace("</body>", MEASURE + "</body>"))
    done = _chromium(out, "", "--window-size=1000,1400", "--dump-dom", page="measured.html")
    found = re.search(r'<pre id="measured">page (\d+) window (\d+) tables (\d+) boxed (\d+) scrolling (.*)</pre>', done.stdout)
    assert found is not None, done.stdout[-2000:]
    page, window, tables, boxed, scrolling = found.groups()
    assert int(page) <= int(window)
    assert tables == boxed
    assert "Subscribers" in scrolling.split(",") and "Hosts" in scrolling.split(",")


def test_the_fleet_summary_gives_the_fleets_own_percentiles(out: Path) -> None:
    """The fleet's p99 of publish to ack comes from the latencies of all hosts: h49's
    0.5 s are 1 in 50 of them, so the fleet's p99 is about 0.49 s."""
    fleet = _page(out).split("<h2>Fleet</h2>")[1].split("<h2>")[0]
    cells = re.search(r'<td class="text">ack_p99_s</td><td>([^<]+)</td><td>([^<]+)</td>', fleet)
    assert cells is not None
    assert re.fullmatch(r"0\.(49|5) s", cells.group(1)) and cells.group(2) == "0.255 s"  # the median host's is h24's and h25's
    assert re.search(r'<td class="text">redelivery_rate</td><td>[0-9.]+%</td><td>0%</td>', fleet)


def test_the_host_filter_hides_the_other_hosts(out: Path, tmp_path: Path) -> None:
    page = _page(out, "#hosts=h07,h4*")
    assert "showing 11 of 50 hosts" in page
    shown = [h for h in HOSTS if f'data-host="{h}">' in page]  # a hidden element's tag goes on with hidden=""
    assert shown == ["h07", *HOSTS[40:]]
    assert '<div data-fleet="" hidden="">' in page
