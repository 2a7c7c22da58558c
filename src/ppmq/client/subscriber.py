"""Subscriber kit: a subscriber name and a function make a working ppmq subscriber.

    #!/opt/ppmq/bin/python3
    from ppmq.client.subscriber import main

    def handle(batch):
        for m in batch.messages:
            print(m.key, m.payload)

    raise SystemExit(main("archive", handle))

What the kit does around the function (PROTOCOL §1, §3, §5):

- Listens on the socket systemd passes (FileDescriptorName=ppmq, as in
  ppmq-subscriber@.socket) or, run by hand, binds the subscriber's `Socket` from
  the broker's config (`-c`, else $PPMQ_CONFIG, else /etc/ppmq/ppmq.yaml).
- Sends RECONNECT to ServerSocket on start, so that whatever an earlier run was
  given but did not ack is delivered again now rather than after `AckRetry`;
  and again whenever the broker connects anew, since acks written to a broker
  that then died may never have been read. Not when the run before exited idle
  having acked all it was given, which the kit records in $RUNTIME_DIRECTORY
  (RuntimeDirectory= of ppmq-subscriber@.service): then nothing is owed, and a
  RECONNECT would only send again the batch whose connection woke the
  subscriber, which the broker wrote before the start. A crash, a stop or a
  batch left unacked leaves no record, and the next start sends RECONNECT.
- Hands each batch the broker pushes to the function, one batch at a time, and
  acks on the delivery connection what the function says succeeded:
  it returns None: the whole batch; it returns keys (or Messages): only those,
  the rest come again after the topic's AckRetry or at the next start; it raises:
  nothing (the exception is logged). `each(fn)` turns a per-message function into
  a batch function: a message whose call raised is not acked.
- Exits once no batch has come for `idle_exit_s` (by default 60 s when socket
  activated, never when run by hand), so that a subscriber systemd started does
  not stay resident; systemd starts it again at the broker's next connection.
- Stops on SIGTERM or SIGINT (`systemctl stop`) after acking the batch in hand.
- Given one connection systemd accepted (a socket unit with `Accept=yes`, for a
  subscriber with `Connections: N`, PROTOCOL §9), serves only it and exits when
  the broker closes it, without RECONNECT: the handler processes of the other
  connections hold the rest of what is in flight.

Delivery is at least once. A message may come again after a crash, an exit
between handling and ack, or because the RECONNECT of a start after one also
returns the batch that woke the subscriber: handlers must be idempotent, as
with any broker that redelivers.

`run` blocks; `serve` is the asyncio flavour, where the function may be a
coroutine function; `main` reads the command line and runs either kind.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from ppmq import sockets
from ppmq.client.library import AsyncClient
from ppmq.client.results import Message
from ppmq.config import default_config_path, load_config
from ppmq.errors import ClientError, ConfigError, ListenError, SubscriberError
from ppmq.protocol.framing import Framer
from ppmq.systemd import configure_logging, listening_unix_socket

if TYPE_CHECKING:
    from typing_extensions import TypeIs

log = logging.getLogger("ppmq.client.subscriber")

FD_NAME = "ppmq"  # FileDescriptorName= of ppmq-subscriber@.socket
ACTIVATED_IDLE_EXIT_S = 60.0
RECONNECT_TIMEOUT_S = 10.0
ACKED_ALL = "acked-all"  # in $RUNTIME_DIRECTORY: the last run exited idle, everything it was given acked
READ_CHUNK = 1 << 16


class Batch(msgspec.Struct, rename="pascal"):
    """What the broker pushes: messages of one topic, by priority then publish order."""

    topic: str
    subscriber: str
    messages: list[Message]


class _Frame(msgspec.Struct, rename="pascal"):
    """Either a batch or the broker's reply to one of our acks."""

    topic: str = ""
    subscriber: str = ""
    messages: list[Message] | None = None
    status: int | None = None
    error: str | None = None


Result = Iterable[str | Message] | None
Handler = Callable[[Batch], Result]
AsyncHandler = Callable[[Batch], Awaitable[Result]]


@dataclass
class Settings:
    """Where a subscriber listens and where its broker is."""

    name: str
    socket: str  # the subscriber's own socket, bound when not socket activated
    server_socket: str | None  # the broker's, for RECONNECT; None skips it
    idle_exit_s: float | None = None  # None: ACTIVATED_IDLE_EXIT_S when activated, else never; 0: never
    max_frame_bytes: int = 1 << 30
    runtime_dir: str | None = None  # where a run records that it acked all it was given; None: nowhere


def settings(
    name: str,
    config: str | None = None,
    socket_path: str | None = None,
    server_socket: str | None = None,
    idle_exit_s: float | None = None,
) -> Settings:
    """Settings from the broker's config file, with explicit paths taking precedence.

    With both paths given no config file is read, so a subscriber can run
    without access to the broker's configuration.
    """
    runtime_dir = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or None  # systemd's RuntimeDirectory=
    if socket_path and server_socket:
        return Settings(name, socket_path, server_socket, idle_exit_s, runtime_dir=runtime_dir)
    path = config or default_config_path()
    loaded = load_config(path)
    match = next((s for s in loaded.subscribers if s.name == name), None)
    if match is None:
        known = ", ".join(s.name for s in loaded.subscribers) or "none"
        raise SubscriberError(f"{path}: no subscriber named {name!r} (Subscribers: {known})")
    socket_path = socket_path or match.socket
    if socket_path is None:
        raise SubscriberError(f"{path}: subscriber {name!r} is a Pull subscriber: nothing is pushed to it (its workers TAKE)")
    return Settings(
        name,
        socket_path,
        server_socket or loaded.server_socket,
        idle_exit_s,
        loaded.max_frame_bytes,
        runtime_dir,
    )


def each(fn: Callable[[Message], Any]) -> Handler:
    """A batch handler that calls `fn` per message and acks those whose call returned."""

    def handle(batch: Batch) -> list[str]:
        done = []
        for message in batch.messages:
            try:
                fn(message)
            except Exception:
                log.exception("%s: message %s of %s failed; not acked", batch.subscriber, message.key, batch.topic)
            else:
                done.append(message.key)
        return done

    return handle


# --- listening, frames in, acks out ----------------------------------------------


class _Listener:
    """The listening socket: systemd's, or one bound (and later removed) by us;
    or, with `Accept=yes`, the one connection systemd accepted (`accepted`)."""

    def __init__(self, s: Settings) -> None:
        inherited = listening_unix_socket(FD_NAME)
        self.activated = inherited is not None
        self.accepted = inherited is not None and not inherited.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        self.bound: sockets.SocketFile | None = None
        if inherited is not None:
            self.sock = inherited
        else:
            self.sock, self.bound = _bind(s.socket)
        self.idle_exit_s = _idle_exit_s(s.idle_exit_s, self.activated)
        where = "the socket systemd passed" if self.activated else s.socket
        where = "the connection systemd accepted" if self.accepted else where
        log.info("%s: listening on %s; idle exit %s", s.name, where, f"after {self.idle_exit_s:g}s" if self.idle_exit_s else "off")

    def close(self) -> None:
        self.sock.close()
        if self.bound is not None:
            self.bound.remove()


def _bind(path: str) -> tuple[socket.socket, sockets.SocketFile]:
    try:
        return sockets.listen(path, 8)
    except ListenError as exc:
        raise SubscriberError(str(exc)) from None


def _idle_exit_s(configured: float | None, activated: bool) -> float | None:
    if configured is None:
        return ACTIVATED_IDLE_EXIT_S if activated else None
    return configured or None


class _Session:
    """One delivery connection, without I/O: bytes in, batches and ack frames out."""

    def __init__(self, max_frame_bytes: int, owed: _Owed) -> None:
        self._framer = Framer(max_frame_bytes)
        self._decoder = msgspec.json.Decoder(_Frame)
        self._acks_sent = 0
        self._owed = owed

    def batches(self, data: bytes) -> list[Batch]:
        """Batches completed by `data`; the broker's replies to acks are logged when not 200."""
        out = []
        for raw in self._framer.feed(data):
            frame = self._decoder.decode(raw)
            if frame.messages is not None:
                out.append(Batch(frame.topic, frame.subscriber, frame.messages))
                self._owed.given += len(frame.messages)
            elif frame.status != 200:
                log.warning("ack rejected by the broker (%s): %s", frame.status, frame.error)
        if self._framer.too_large is not None:
            raise SubscriberError(f"a frame from the broker is too large: {self._framer.too_large}")
        return out

    def ack_frame(self, batch: Batch, result: Result) -> bytes | None:
        """The ack for what the handler returned: all on None, else the keys it named."""
        if result is None:
            keys = [m.key for m in batch.messages]
        else:
            keys = [r.key if isinstance(r, Message) else r for r in result]
        if not keys:
            return None
        self._owed.acked += len(keys)
        self._acks_sent += 1
        wrapper = {"Topic": batch.topic, "Subscriber": batch.subscriber, "Acks": keys, "Id": self._acks_sent}
        return msgspec.json.encode(wrapper) + b"\n"


class _Owed:
    """A run's messages given and acked: all acked when the counts meet."""

    def __init__(self) -> None:
        self.given = self.acked = 0


def _acked_all_before(s: Settings) -> bool:
    """Whether the run before exited idle having acked all it was given; the
    record is used up, so that a crash of this run leaves none."""
    if s.runtime_dir is None:
        return False
    try:
        os.unlink(os.path.join(s.runtime_dir, ACKED_ALL))
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("%s: cannot use %s (%s); sending RECONNECT", s.name, s.runtime_dir, exc)
        return False
    return True


def _record_acked_all(s: Settings) -> None:
    if s.runtime_dir is None:
        return
    try:
        with open(os.path.join(s.runtime_dir, ACKED_ALL), "w"):
            pass
    except OSError as exc:
        log.warning("%s: cannot write to %s (%s); the next start sends RECONNECT", s.name, s.runtime_dir, exc)


def _failed(batch: Batch) -> None:
    log.exception("%s: handler failed on a batch of %d from %s; not acked", batch.subscriber, len(batch.messages), batch.topic)


# --- serving -----------------------------------------------------------------------


def run(handler: Handler | AsyncHandler, s: Settings) -> None:
    """Serve the broker's connections until idle for `idle_exit_s`; blocks.

    The handler runs on one thread of its own, always the same one, so it may
    block, keep thread-bound resources, and even run an event loop itself.
    Called on the main thread, SIGTERM and SIGINT stop it gracefully: the batch
    being handled is finished and acked first.
    """
    asyncio.run(_serve_until_signalled(handler, s))


async def _serve_until_signalled(handler: Handler | AsyncHandler, s: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if threading.current_thread() is threading.main_thread() else ()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await serve(handler, s, stop)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


async def serve(handler: Handler | AsyncHandler, s: Settings, stop: asyncio.Event | None = None) -> None:
    """`run` for asyncio programs: a coroutine function is awaited on the loop,
    a plain function is called on a thread of its own. Setting `stop` ends it
    once the batch being handled is acked."""
    stop = stop or asyncio.Event()
    listener = _Listener(s)
    executor = ThreadPoolExecutor(1, thread_name_prefix="ppmq-handler")
    call = _caller(handler, executor)
    owed = _Owed()
    try:
        listener.sock.setblocking(False)
        if listener.accepted:
            ended = await _serve_socket(listener.sock, call, s, stop, listener.idle_exit_s, owed)
        else:
            ended = await _serve_listening(listener, call, s, stop, owed)
            if ended == IDLE and owed.acked >= owed.given:
                _record_acked_all(s)
        why = (
            f"idle for {listener.idle_exit_s:g}s"
            if ended == IDLE
            else "stopped"
            if ended == STOPPED
            else "the broker closed the connection"
        )
        log.info("%s: %s, exiting", s.name, why)
    finally:
        listener.close()
        executor.shutdown(wait=False)


CLOSED, IDLE, STOPPED = "closed", "idle", "stopped"  # how serving a connection ended


async def _serve_listening(
    listener: _Listener, call: Callable[[Batch], Awaitable[Result]], s: Settings, stop: asyncio.Event, owed: _Owed
) -> str:
    """Serve each connection the broker makes, one after another, until IDLE or STOPPED."""
    if not _acked_all_before(s):
        await _reconnect(s)
    loop = asyncio.get_running_loop()
    ended, connections = CLOSED, 0
    while ended == CLOSED:
        accepted = await _first(loop.sock_accept(listener.sock), stop, listener.idle_exit_s)
        if isinstance(accepted, str):  # IDLE or STOPPED rather than (socket, address)
            return accepted
        connections += 1
        if connections > 1:
            # The broker restarted or the link broke: acks written just before may
            # never have been read, and would hold those messages in flight.
            await _reconnect(s)
        ended = await _serve_socket(accepted[0], call, s, stop, listener.idle_exit_s, owed)
    return ended


async def _serve_socket(
    sock: socket.socket,
    call: Callable[[Batch], Awaitable[Result]],
    s: Settings,
    stop: asyncio.Event,
    idle_exit_s: float | None,
    owed: _Owed,
) -> str:
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=READ_CHUNK)
    try:
        return await _serve_connection(reader, writer, call, s, stop, idle_exit_s, owed)
    finally:
        writer.close()


async def _first(awaitable: Awaitable[Any], stop: asyncio.Event, timeout_s: float | None) -> Any:
    """The awaitable's result, or IDLE after timeout_s, or STOPPED once `stop` is set."""
    task = asyncio.ensure_future(awaitable)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({task, stopping}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if task in done:
        return task.result()
    task.cancel()
    return STOPPED if stopping in done else IDLE


def _is_async(handler: Handler | AsyncHandler) -> TypeIs[AsyncHandler]:
    """A coroutine function is an AsyncHandler; any other callable is taken for a
    Handler (and run on the executor), even one that returns an awaitable."""
    return inspect.iscoroutinefunction(handler)


def _caller(handler: Handler | AsyncHandler, executor: ThreadPoolExecutor) -> Callable[[Batch], Awaitable[Result]]:
    """The handler as a coroutine function: plain functions go to the executor's one thread."""
    if _is_async(handler):
        return handler

    async def call(batch: Batch) -> Result:
        return await asyncio.get_running_loop().run_in_executor(executor, handler, batch)

    return call


async def _serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    call: Callable[[Batch], Awaitable[Result]],
    s: Settings,
    stop: asyncio.Event,
    idle_exit_s: float | None,
    owed: _Owed,
) -> str:
    """Handle batches until the broker closes (CLOSED), nothing came for
    idle_exit_s (IDLE) or `stop` is set (STOPPED; the batch in hand is acked first)."""
    session = _Session(s.max_frame_bytes, owed)
    try:
        while True:
            data = await _first(reader.read(READ_CHUNK), stop, idle_exit_s)
            if isinstance(data, str):  # IDLE or STOPPED rather than bytes
                return data
            if not data:
                return CLOSED
            for batch in session.batches(data):
                if stop.is_set():
                    return STOPPED
                try:
                    result = await call(batch)
                except Exception:
                    _failed(batch)
                    continue
                if (frame := session.ack_frame(batch, result)) is not None:
                    writer.write(frame)
                    await writer.drain()
    except OSError as exc:
        log.info("%s: delivery connection failed: %s", s.name, exc)
        return CLOSED


async def _reconnect(s: Settings) -> None:
    """PROTOCOL §3 RECONNECT: everything in flight to us comes again."""
    if s.server_socket is None:
        return
    try:
        client = await AsyncClient.connect(s.server_socket, timeout_s=RECONNECT_TIMEOUT_S)
        async with client:
            await client.reconnect(s.name)
    except ClientError as exc:
        log.warning("%s: RECONNECT failed (%s); unacked messages come again after AckRetry", s.name, exc)


# --- command line ------------------------------------------------------------------


def main(name: str, handler: Handler | AsyncHandler, argv: list[str] | None = None) -> int:
    """Run a subscriber script: options from the command line, logging set up for
    journald or a terminal; exit status 0 after an idle exit or SIGTERM, 1 when it
    cannot run."""
    args = _parser(name).parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging()
    try:
        s = settings(args.name, args.config, args.socket, args.server_socket, args.idle_exit)
        run(handler, s)
    except (ConfigError, SubscriberError) as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _parser(name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=f"ppmq subscriber {name}")
    parser.add_argument("-c", "--config", help="the broker's config (default: $PPMQ_CONFIG, then /etc/ppmq/ppmq.yaml)")
    parser.add_argument("--name", default=name, help=f"subscriber name in the config (default: {name})")
    parser.add_argument("--socket", help="listen here instead of the subscriber's Socket from the config")
    parser.add_argument("--server-socket", help="the broker's ServerSocket, for RECONNECT")
    parser.add_argument(
        "--idle-exit",
        type=float,
        metavar="SECONDS",
        help=f"exit when no batch came for this long; 0: never (default: {ACTIVATED_IDLE_EXIT_S:g} when socket activated, else never)",
    )
    return parser
