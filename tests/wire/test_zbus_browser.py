"""A browser consuming from ZbusListen (PROTOCOL §11): tests/wire/zbus_page.html,
served from 127.0.0.1 (a secure context, so that it may sign with the Web
Crypto API), opens a WebSocket to the broker, subscribes with signed requests
and lists what arrives. Headless Chromium runs it; the test reads the page's
DOM over Chromium's remote debugging protocol, while the page is still
connected, and the broker's STATUS."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest
import websocket

from tests.conftest import WAIT_S, BrokerProcess, wait_for
from tests.wire.test_zbus import SECRET, tcp_broker

PAGE = Path(__file__).with_name("zbus_page.html")
PAYLOADS: list[Any] = ["hello", {"n": 1, "list": [1, 2]}, "grüße ✓", 42, "last"]


@pytest.fixture
def page_url() -> Iterator[str]:
    """The page's URL, served by http.server on 127.0.0.1 on a free port."""
    handler = functools.partial(_QuietHandler, directory=str(PAGE.parent))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{PAGE.name}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class Chromium:
    """Headless Chromium with remote debugging on a free port (it writes the
    port into DevToolsActivePort), one page driven over its WebSocket."""

    def __init__(self, tmp: Path) -> None:
        browser = shutil.which("chromium") or pytest.skip("no chromium (make test installs it)")
        profile = tmp / "chromium"
        self.proc = subprocess.Popen(
            [
                browser,
                "--headless",
                "--disable-gpu",
                "--no-sandbox",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            active = profile / "DevToolsActivePort"
            wait_for(lambda: active.exists() and len(active.read_text().splitlines()) >= 2, what="Chromium's DevToolsActivePort")
            port = active.read_text().splitlines()[0]
            targets = json.loads(urlopen(f"http://127.0.0.1:{port}/json/list", timeout=WAIT_S).read())
            target = next(t for t in targets if t["type"] == "page")
            self.conn = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=WAIT_S, suppress_origin=True)
        except BaseException:
            self.proc.kill()
            self.proc.wait(timeout=WAIT_S)
            raise
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict:
        self.next_id += 1
        self.conn.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            answer = json.loads(self.conn.recv())
            if answer.get("id") == self.next_id:
                assert "error" not in answer, answer
                return answer["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def seen(self, wanted: Callable[[dict], bool]) -> dict | None:
        """What the page shows (SEEN), if it is what is `wanted`."""
        shown = self.evaluate(SEEN)
        return shown if wanted(shown) else None

    def close(self) -> None:
        self.conn.close()
        self.proc.kill()
        self.proc.wait(timeout=WAIT_S)


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Chromium]:
    browser = Chromium(tmp_path)
    try:
        yield browser
    finally:
        browser.close()


# What the page shows: its state line and each listed message, as JSON
# ("loading" until the page has replaced about:blank).
SEEN = """({
  state: document.getElementById("state")?.textContent ?? "loading",
  messages: [...document.querySelectorAll("#messages li")].map(li => ({id: li.dataset.id, body: li.textContent, acked: li.dataset.acked})),
})"""


def publish(b: BrokerProcess, payloads: list[Any]) -> None:
    with b.client() as c:
        c.publish("q", [{"Payload": payload} for payload in payloads])


@pytest.mark.parametrize(("channel", "mode"), [("e", "explicit"), ("w", "window"), ("d", "delivery")])
def test_a_page_in_chromium_subscribes_signed_and_shows_each_message_acked(broker_factory, short_tmp, page_url, chromium, channel, mode):
    b = tcp_broker(broker_factory, short_tmp)
    publish(b, PAYLOADS[:2])
    query = {"ws": f"ws://127.0.0.1:{b.port}/", "mq": "q", "channel": channel, "window": 2, "ack": mode, "apiKey": "k", "secret": SECRET}
    chromium.call("Page.navigate", url=f"{page_url}?{urlencode(query)}")
    wait_for(lambda: len(chromium.evaluate(SEEN)["messages"]) == 2, what="the first two messages in the page")
    publish(b, PAYLOADS[2:])  # pushed as they come
    seen = wait_for(lambda: chromium.seen(lambda s: len(s["messages"]) == len(PAYLOADS)), what="every message in the page")
    assert seen["state"] == "subscribed"
    assert [json.loads(m["body"]) for m in seen["messages"]] == PAYLOADS
    assert len({m["id"] for m in seen["messages"]}) == len(PAYLOADS)
    if mode == "explicit":
        wait_for(lambda: all(m.get("acked") == "200" for m in chromium.evaluate(SEEN)["messages"]), what="each ack answered")
    # acked while the page is still connected: nothing is in flight, nothing ready
    wait_for(lambda: b.sub_status("q", channel)["Acked"] == len(PAYLOADS), what=f"{mode}: every message acked")
    status = b.sub_status("q", channel)
    assert (status["InFlight"], sum(status["Ready"])) == (0, 0)
    assert chromium.evaluate(SEEN)["state"] == "subscribed"
    # the text the page signs is Python's, as zbuspy makes it: keys sorted, compact, non-ASCII escaped
    covered = {"headers": {"b": 1, "a": "grüße ✓ \x7f 𝄞", "z": None}, "body": [{"y": True, "x": "\n"}, 2.5]}
    assert chromium.evaluate(f"canonical({json.dumps(covered)})") == json.dumps(covered, sort_keys=True, separators=(",", ":"))


def test_a_page_with_a_wrong_secret_is_refused_and_shown_nothing(broker_factory, short_tmp, page_url, chromium):
    b = tcp_broker(broker_factory, short_tmp)
    publish(b, PAYLOADS)
    query = {"ws": f"ws://127.0.0.1:{b.port}/", "mq": "q", "channel": "e", "window": 2, "ack": "explicit", "apiKey": "k", "secret": "wrong"}
    chromium.call("Page.navigate", url=f"{page_url}?{urlencode(query)}")
    seen = wait_for(lambda: chromium.seen(lambda s: s["state"].startswith("refused")), what="the refusal in the page")
    assert seen["state"].startswith("refused 403")
    status = b.settled_status()["Topics"]["q"]["Subscribers"]["e"]  # a refused sub takes nothing
    assert (status["InFlight"], sum(status["Ready"])) == (0, len(PAYLOADS))
    assert chromium.evaluate(SEEN)["messages"] == []
