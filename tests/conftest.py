"""Fixtures that run the real thing: a `ppmq serve` process on a tmp dir, real Unix
sockets, real LMDB, and subscribers listening on their own sockets."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from ppmq.client.library import Client
from ppmq.protocol.framing import Framer

WAIT_S = 15.0


def wait_for(predicate: Callable[[], Any], timeout_s: float = WAIT_S, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


def rss_anon(pid: int) -> int:
    """Anonymous resident bytes: the broker's own memory, without LMDB's file pages."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc")


class Subscriber:
    """A subscriber on a real Unix socket: records every batch; acks if told to.

    `ack="connection"` acks on the delivery connection, `"server"` through the
    broker's server socket as ppMQ subscribers do, None leaves acking to the test.
    """

    def __init__(self, path: str, ack: str | None = "connection", server_socket: str | None = None) -> None:
        self.path = path
        self.ack = ack
        self.server_socket = server_socket
        self.batches: list[dict] = []
        self.lock = threading.Lock()
        self.connections = 0
        self._stop = False
        self._conns: list[socket.socket] = []
        if os.path.exists(path):
            os.unlink(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def messages(self) -> list[dict]:
        with self.lock:
            return [dict(m, Topic=b["Topic"]) for b in self.batches for m in b["Messages"]]

    def payloads(self, topic: str | None = None) -> list[Any]:
        return [m["Payload"] for m in self.messages if topic is None or m["Topic"] == topic]

    def wait_messages(self, n: int, timeout_s: float = WAIT_S) -> list[dict]:
        wait_for(lambda: len(self.messages) >= n, timeout_s, f"{n} messages at {self.path} (have {len(self.messages)})")
        return self.messages

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            self._conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        framer = Framer(1 << 30)
        client = Client(self.server_socket) if self.ack == "server" else None
        try:
            while data := conn.recv(1 << 16):
                for frame in framer.feed(data):
                    obj = msgspec.json.decode(frame)
                    if "Status" in obj:
                        assert obj["Status"] == 200, obj
                        continue
                    with self.lock:
                        self.batches.append(obj)
                    keys = [m["Key"] for m in obj["Messages"]]
                    if self.ack == "connection":
                        wrapper = {"Topic": obj["Topic"], "Subscriber": obj["Subscriber"], "Acks": keys, "Id": "a"}
                        conn.sendall(msgspec.json.encode(wrapper) + b"\n")
                    elif client is not None:
                        client.ack(obj["Topic"], obj["Subscriber"], keys)
        except OSError:
            pass
        finally:
            if client is not None:
                client.close()

    def close(self) -> None:
        """Stop listening and drop every connection (the broker sees the subscriber go)."""
        self._stop = True
        self.thread.join()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self.sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


class BrokerProcess:
    """`ppmq serve -c FILE` as a child process; restartable on the same DataPath."""

    def __init__(self, tmp: Path, config: dict | str) -> None:
        """`config` as a dict, or as YAML text written to the file verbatim."""
        self.tmp = tmp
        self.config_path = tmp / "ppmq.yaml"
        self.config_path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
        self.config = yaml.safe_load(config) if isinstance(config, str) else config
        self.socket = self.config["ServerSocket"]
        self.proc: subprocess.Popen | None = None
        self.log_path = tmp / "broker.log"

    def sub_socket(self, name: str) -> str:
        return next(s["Socket"] for s in self.config["Subscribers"] if s["Name"] == name)

    def start(self, env: dict[str, str] | None = None, wait: bool = True) -> BrokerProcess:
        """Run `ppmq serve`; `env` adds variables (NOTIFY_SOCKET, WATCHDOG_USEC...)."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ppmq.cli", "serve", "-c", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        if wait:
            wait_for(self._accepting, what=f"broker socket {self.socket}; log:\n{self.log}")
        return self

    def reload(self, config: dict | str) -> None:
        """Rewrite the config file and send SIGHUP, as `systemctl reload` does."""
        self.config_path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
        if not isinstance(config, str):
            self.config = config
        self.proc.send_signal(signal.SIGHUP)

    def _accepting(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"broker exited with {self.proc.returncode}; log:\n{self.log}")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self) -> Client:
        return Client(self.socket, timeout_s=WAIT_S)

    def status(self) -> dict:
        """The STATUS Body as the broker sent it."""
        with self.client() as c:
            return c.request({"Command": "STATUS"}).body

    def sub_status(self, topic: str, sub: str) -> dict:
        return self.status()["Topics"][topic]["Subscribers"][sub]

    def settled_status(self) -> dict:
        """STATUS once the broker has acted on everything before it, for a test
        that asserts something did not happen: the reply to a STATUS asked after
        another one was answered. The first one's step fills every subscriber
        connection that can take a batch and runs the timers that are due; after
        it, on the event loop and before the second one is read, a connection
        that took a batch opens for the next one, each subscriber link (and
        each lane) looks whether to connect, a waiting TAKE is woken and sends
        its TAKE again. The second one's step applies what they sent, and its
        counters show the first one's batches."""
        self.status()
        return self.status()

    def stop(self) -> int:
        """SIGTERM and wait: the clean shutdown a service manager asks for."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=WAIT_S)

    def kill(self) -> None:
        """kill -9: no chance to flush anything that was not committed."""
        self.proc.kill()
        self.proc.wait(timeout=WAIT_S)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def make_config(tmp: Path, topics: list[dict], subscribers: list[str] | list[dict] = (), **extra: Any) -> dict:
    """A config on tmp; subscriber sockets go in tmp/sub/, which is made here as
    tmpfiles.d makes /run/ppmq/sub: whoever binds a socket needs its directory."""
    (tmp / "sub").mkdir(exist_ok=True)
    subs = []
    for s in subscribers:
        s = {"Name": s} if isinstance(s, str) else s
        subs.append({"Socket": str(tmp / "sub" / f"{s['Name']}.sock"), **s})
    return {
        "ServerSocket": str(tmp / "ppmq.sock"),
        "DataPath": str(tmp / "data"),
        "Subscribers": subs,
        "Topics": topics,
        "RetryMax": "200ms",
        **extra,
    }


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp dir: Unix socket paths must stay under 108 bytes."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ppmq-") as d:
        yield Path(d)


@pytest.fixture
def broker_factory(short_tmp: Path) -> Iterator[Callable[..., BrokerProcess]]:
    started: list[BrokerProcess] = []
    subs: list[Subscriber] = []

    def factory(topics: list[dict], subscribers=(), start: bool = True, **extra: Any) -> BrokerProcess:
        b = BrokerProcess(short_tmp, make_config(short_tmp, topics, subscribers, **extra))
        started.append(b)
        return b.start() if start else b

    factory.subscriber = lambda b, name, **kw: subs.append(Subscriber(b.sub_socket(name), server_socket=b.socket, **kw)) or subs[-1]
    yield factory
    for s in subs:
        s.close()
    for b in started:
        if b.alive():
            b.kill()


class NotifyListener:
    """A NOTIFY_SOCKET of our own, as systemd binds it: every datagram the broker
    sends, with the sender's pid (SO_PASSCRED) and when it arrived."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.received: list[tuple[float, int, dict[str, str]]] = []  # (monotonic, pid, fields)
        self.on_message: Callable[[dict[str, str]], None] | None = None
        self._flushes = itertools.count(1)
        self._stop = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def env(self, **extra: str) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.path, **extra}

    def _read(self) -> None:
        creds_size = socket.CMSG_LEN(12)
        while not self._stop:
            try:
                data, ancdata, _, _ = self.sock.recvmsg(4096, creds_size)
            except (TimeoutError, OSError):
                continue
            pid = next((int.from_bytes(d[:4], "little") for lvl, typ, d in ancdata if typ == socket.SCM_CREDENTIALS), -1)
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            if self.on_message is not None:
                self.on_message(fields)
            self.received.append((time.monotonic(), pid, fields))

    def messages(self, key: str) -> list[dict[str, str]]:
        return [f for _, _, f in list(self.received) if key in f]

    def wait(self, key: str, value: str | None = None, count: int = 1, timeout_s: float = WAIT_S) -> list[dict[str, str]]:
        def found() -> list[dict[str, str]]:
            hits = [f for f in self.messages(key) if value is None or f[key] == value]
            return hits if len(hits) >= count else []

        return wait_for(found, timeout_s, f"{count}x {key}={value or '*'} on NOTIFY_SOCKET (got {self.received[-5:]})")

    def flush(self) -> float:
        """Send a datagram of our own and wait until it is read; return when it
        was. The socket queues datagrams in the order they came, so every one the
        broker sent before this call is in `received` by then, stamped earlier."""
        token = str(next(self._flushes))
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sender.sendto(b"FLUSH=" + token.encode(), self.path)
        finally:
            sender.close()
        return wait_for(
            lambda: next((at for at, _, f in list(self.received) if f.get("FLUSH") == token), None),
            what="our own datagram on NOTIFY_SOCKET",
        )

    def close(self) -> None:
        self._stop = True
        self.thread.join()
        self.sock.close()


@pytest.fixture
def notify_socket(short_tmp: Path) -> Iterator[NotifyListener]:
    listener = NotifyListener(short_tmp / "notify")
    yield listener
    listener.close()
