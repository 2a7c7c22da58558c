"""`ppmq report` on the journals of 50 hosts, written by `Journal` as brokers write
them: one row per host, a fleet summary naming the worst hosts, and a page whose
charts render in headless Chromium and whose host filter hides the other hosts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from pyspark.sql import SparkSession

from ppmq.cli.main import main
from ppmq.core import events as ev
from ppmq.core.events import Event
from ppmq.server.journal import Journal

NS = 1_000_000_000
T0 = 1_795_300_000 * NS
HOSTS = [f"h{i:02d}" for i in range(50)]
MINUTES = 5
BATCH = 10  # messages published per host in its busiest minute
REDELIVERED = 5  # of them, delivered again on every host whose number ends in 3
PANEL_COLOUR = (44, 160, 44)  # the ack line of a host's panel, drawn over the others, #2ca02c
BAR_COLOUR = (214, 39, 40)  # a top-N chart's bars, #d62728


def _ack_s(i: int) -> float:
    """Host i acks every message this long after its publish: h49 is the slowest."""
    return 0.01 * (i + 1)


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
        for m in range(MINUTES):
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
        published = sum(_size(i, m) for m in range(MINUTES))
        delivered = published + (MINUTES * REDELIVERED if i % 10 == 3 else 0)
        assert (row["published"], row["acked"], row["delivered"]) == (published, published, delivered), host
        assert row["redelivery_rate"] == pytest.approx(MINUTES * REDELIVERED / delivered if i % 10 == 3 else 0.0), host
        assert row["ack_p99_s"] == pytest.approx(_ack_s(i), rel=0.01), host


def _page(out: Path, fragment: str = "") -> str:
    """The page's DOM after its script ran, as headless Chromium dumps it."""
    return _chromium(out, fragment, "--dump-dom").stdout


def _screenshot(out: Path, tmp_path: Path, fragment: str = "") -> Image.Image:
    png = tmp_path / "page.png"
    _chromium(out, fragment, f"--screenshot={png}", "--window-size=1200,1400", "--hide-scrollbars")
    return Image.open(png).convert("RGB")


def _chromium(out: Path, fragment: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on report.html; `make test` installs it."""
    browser = shutil.which("chromium") or pytest.skip("no chromium (make test installs it)")
    url = (out / "report.html").resolve().as_uri() + fragment
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


def test_the_host_filter_hides_the_other_hosts(out: Path, tmp_path: Path) -> None:
    page = _page(out, "#hosts=h07,h4*")
    assert "showing 11 of 50 hosts" in page
    shown = [h for h in HOSTS if f'data-host="{h}">' in page]  # a hidden element's tag goes on with hidden=""
    assert shown == ["h07", *HOSTS[40:]]
    assert '<div data-fleet="" hidden="">' in page
