"""Composition root: wires config, store, broker, writer, server and subscriber links.

Nothing else builds these objects, and none of them is a global: a test can
run a whole broker in-process, and `ppmq serve` is this module plus a logger.
It is also where the broker meets systemd: READY once the store is open and the
socket accepts, STATUS kept current, WATCHDOG only while the writer is healthy,
RELOADING/READY around a SIGHUP reload, STOPPING on SIGTERM. And where it meets
Prometheus: the Metrics textfile, written from STATUS every Interval and at stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ppmq.config import Config, SubscriberConfig, load_config, split_host_port
from ppmq.core.broker import Broker
from ppmq.core.ops import Reconfigure
from ppmq.errors import ConfigError
from ppmq.protocol import messages as p
from ppmq.server.connection_limit import ConnectionLimit
from ppmq.server.group_commit import GroupCommit
from ppmq.server.journal import Journal
from ppmq.server.listener import Server
from ppmq.server.metrics import CommitTimes, exposition, write_textfile
from ppmq.server.parallel_push import ParallelLink
from ppmq.server.phpmq import PhpmqServer
from ppmq.server.push import SubscriberLink
from ppmq.server.take_waits import TakeWaits
from ppmq.store.store import Store
from ppmq.systemd import Notifier

if TYPE_CHECKING:
    from ppmq.server.zbus import ZbusServer, ZbusTcpServer

log = logging.getLogger("ppmq.daemon")

STOP_GRACE_S = 5.0  # how long open connections get to read their last replies
STATUS_EVERY_S = 2.0  # how often STATUS= is refreshed when it changed
# Changing these needs a restart: they are the environment the others run in.
RESTART_ONLY = (
    "server_socket",
    "phpmq_socket",
    "zbus_socket",
    "zbus_listen",
    "data_path",
    "sync",
    "max_store_bytes",
    "socket_mode",
    "socket_group",
    "journal",
    "metrics",
)


async def run(
    config: Config,
    stop: asyncio.Event | None = None,
    *,
    config_path: str | Path | None = None,
    inherited: socket.socket | None = None,
) -> None:
    """Serve until `stop` is set or SIGTERM/SIGINT arrives, then shut down cleanly.

    With `config_path`, SIGHUP re-reads it; `inherited` is a listening socket
    from systemd to use instead of binding ServerSocket.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    notifier = Notifier()
    store = Store(config.data_path, sync=config.sync, max_bytes=config.max_store_bytes)
    daemon = None
    try:
        daemon = Daemon(config, store, notifier, config_path)
        loop.add_signal_handler(signal.SIGHUP, daemon.request_reload)
        for sig in (signal.SIGTERM, signal.SIGINT):  # before the socket accepts: a client may stop us at once
            loop.add_signal_handler(sig, stop.set)
        await daemon.start(inherited)
        await daemon.serve(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if daemon is not None:
            await daemon.shutdown()
        store.close()
    log.info("stopped")


def _journal(config: Config) -> Journal | None:
    """The delivery journal under DataPath/journal/, if the config keeps one."""
    if not config.journaled:
        return None
    jc = config.journal
    return Journal(os.path.join(config.data_path, "journal"), jc.segment_bytes, jc.max_bytes, jc.host).start()


class Daemon:
    """The running broker: its parts, its subscribers' links, and its systemd face."""

    def __init__(self, config: Config, store: Store, notifier: Notifier, config_path: str | Path | None) -> None:
        self.config = config
        self.store = store
        self.notifier = notifier
        self.config_path = config_path
        self.commit_times = CommitTimes()
        self.broker = Broker(config, store, time.time_ns(), complete_status=self._complete_status)
        self.journal = _journal(config)
        self.writer = GroupCommit(
            self.broker,
            self.journal.put if self.journal else None,
            durable=config.sync and not config.in_memory,
            on_step=self.commit_times.observe,
        )
        self.policy = self.broker.policy  # switched by the broker, in the step that switches the config
        self.takes = TakeWaits(self.writer)  # TAKEs of every listener's connections (PROTOCOL §9)
        self.connections = ConnectionLimit(config.max_connections)  # of every listener together (PROTOCOL §9)
        self.server = Server(
            config.server_socket,
            self.writer,
            config.max_frame_bytes,
            connections=self.connections,
            read_timeout_s=config.read_timeout,
            policy=self.policy,
            takes=self.takes,
        )
        self.phpmq = (
            PhpmqServer(config.phpmq_socket, self.writer, self.takes, config, self.connections, self.policy)
            if config.phpmq_socket
            else None
        )
        self.zbus: ZbusServer | None = None
        self.zbus_tcp: ZbusTcpServer | None = None
        if config.zbus_socket or config.zbus_listen:  # its HTTP and WebSocket parsers are loaded only for a zbus listener
            from ppmq.server.zbus import ZbusServer, ZbusTcpServer

            if config.zbus_socket:
                self.zbus = ZbusServer(config.zbus_socket, self.writer, self.takes, config, self.connections, self.policy)
            if config.zbus_listen:
                self.zbus_tcp = ZbusTcpServer("", self.writer, self.takes, config, self.connections, self.policy)
        self.links: dict[str, tuple[SubscriberLink | ParallelLink, asyncio.Task]] = {}
        self.last_error = ""
        self._metrics_error = ""  # the textfile's last write error, logged once
        self._tasks: list[asyncio.Task] = []
        self._writing: asyncio.Task | None = None
        self._reload_wanted = asyncio.Event()

    async def start(self, inherited: socket.socket | None) -> None:
        await self.server.start(inherited, self.config.socket_mode, self.config.socket_group)
        if self.phpmq is not None:
            await self.phpmq.start(self.config.socket_mode, self.config.socket_group)
        if self.zbus is not None:
            await self.zbus.start(self.config.socket_mode, self.config.socket_group)
        if self.zbus_tcp is not None:
            assert self.config.zbus_listen is not None, "checked by load_config"
            await self.zbus_tcp.start_tcp(*split_host_port(self.config.zbus_listen))
        self._writing = asyncio.create_task(self.writer.run(), name="writer")
        for sub in self.config.subscribers:
            if not sub.pull:  # a Pull subscriber is never pushed to
                self._link(sub)
        self._tasks = [asyncio.create_task(self._reloads(), name="reloads")]
        if self.notifier.enabled:  # STATUS= goes nowhere without systemd: not worked out every few seconds for nobody
            self._tasks.append(asyncio.create_task(self._report_status(), name="status"))
        if self.config.metrics is not None:
            self._tasks.append(asyncio.create_task(self._write_metrics_every(self.config.metrics.interval), name="metrics"))
        if self.notifier.watchdog_interval_s:
            self._tasks.append(asyncio.create_task(self._watchdog(self.notifier.watchdog_interval_s), name="watchdog"))
        log.info(
            "serving on %s%s: %d topics, %d subscribers, data in %s (sync %s)",
            self.config.server_socket,
            " (from systemd)" if inherited is not None else "",
            len(self.config.topics),
            len(self.config.subscribers),
            self.store.path,
            "on" if self.config.sync else "off",
        )
        self.notifier.ready(self.status_text())

    async def serve(self, stop: asyncio.Event) -> None:
        """Until a stop request; a writer that dies takes the broker down with it."""
        stopping = asyncio.create_task(stop.wait())
        assert self._writing is not None, "serve() after start()"
        await asyncio.wait({stopping, self._writing}, return_when=asyncio.FIRST_COMPLETED)
        if self._writing.done():
            stopping.cancel()
            self._writing.result()  # raise what killed it
            raise RuntimeError("the writer stopped unexpectedly")

    async def shutdown(self) -> None:
        """Stop accepting, finish the transaction in flight, answer what committed."""
        log.info("stopping")
        self.notifier.stopping()
        for task in self._tasks:
            task.cancel()
        await self.server.stop()
        if self.phpmq is not None:
            await self.phpmq.stop()
        if self.zbus is not None:
            await self.zbus.stop()
        if self.zbus_tcp is not None:
            await self.zbus_tcp.stop()
        # Links first: the batches they give back (unwritten or still queued) are
        # applied by the writer's last steps, so they stay ready in the store.
        await self._unlink(list(self.links))
        if self.config.metrics is not None and self._writing is not None and not self._writing.done():
            await self._write_metrics()  # the counters as they stay until the next start
        self.writer.stop()
        if self._writing is not None:
            await asyncio.gather(self._writing, *self._tasks, return_exceptions=True)
        await self.server.close_connections(STOP_GRACE_S)
        if self.phpmq is not None:
            await self.phpmq.close_connections()
        if self.zbus is not None:
            await self.zbus.close_connections()
        if self.zbus_tcp is not None:
            await self.zbus_tcp.close_connections()
        if self.journal is not None:
            self.journal.close()  # after the last step, so that its events are written too

    # --- subscribers ----------------------------------------------------------------------

    def _link(self, sub: SubscriberConfig) -> None:
        link = (ParallelLink if sub.connections > 1 else SubscriberLink)(
            sub,
            self.writer,
            self.config.retry_max,
            self.config.max_frame_bytes,
            read_timeout_s=self.config.read_timeout,
            policy=self.policy,
        )
        self.links[sub.name] = (link, asyncio.create_task(link.run(), name=f"subscriber {sub.name}"))

    async def _unlink(self, names: list[str]) -> None:
        links = [self.links.pop(name) for name in names]
        for link, task in links:
            link.stopping()
            task.cancel()
        tasks = [task for _, task in links]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _relink(self, config: Config) -> None:
        """Links follow the new config: new ones start, removed ones stop, a moved
        socket or Connections reconnects; the others keep their connections and take the new limits."""
        wanted = {s.name: s for s in config.subscribers if not s.pull}  # a Pull subscriber is never pushed to
        moved = [n for n, (link, _) in self.links.items() if n in wanted and _moved(link.config, wanted[n])]
        await self._unlink([n for n in self.links if n not in wanted] + moved)
        for name, sub in wanted.items():
            if name not in self.links:
                self._link(sub)
                continue
            self.links[name][0].follow(sub, config.retry_max, config.max_frame_bytes, config.read_timeout)

    # --- reload (SIGHUP) --------------------------------------------------------------------

    def request_reload(self) -> None:
        self._reload_wanted.set()

    async def _reloads(self) -> None:
        """One reload at a time; SIGHUPs during one fold into the next."""
        while True:
            await self._reload_wanted.wait()
            self._reload_wanted.clear()
            self.notifier.reloading()
            try:
                await self.reload()
            except Exception as exc:  # the broker keeps running on the old config
                log.exception("reload failed")
                self.last_error = f"reload failed: {exc}"
            self.notifier.ready(self.status_text())

    async def reload(self) -> None:
        if self.config_path is None:
            log.warning("SIGHUP ignored: the broker was not started from a config file")
            return
        try:
            config = load_config(self.config_path)
        except ConfigError as exc:
            self._reload_refused(exc.errors)
            return
        self._keep_restart_only(config)
        reply = await self.writer.call(Reconfigure(config))
        if reply.status != 200:
            self._reload_refused(str(reply.error).splitlines())
            return
        old, self.config = self.config, config
        await self._relink(config)
        self.server.max_frame_bytes = config.max_frame_bytes
        if self.phpmq is not None:
            self.phpmq.config = config
        if self.zbus is not None:
            self.zbus.config = config
        if self.zbus_tcp is not None:
            self.zbus_tcp.config = config
        self.server.read_timeout_s, self.connections.max_connections = config.read_timeout, config.max_connections
        self.last_error = ""
        log.info("config reloaded: %s", _summary(old, config))

    def _reload_refused(self, errors: list[str]) -> None:
        for line in errors:
            log.error("reload: %s", line)
        log.error("reload refused; still running the previous config")
        self.last_error = f"reload refused: {errors[0]}" + (f" (+{len(errors) - 1} more)" if len(errors) > 1 else "")

    def _keep_restart_only(self, config: Config) -> None:
        for key in RESTART_ONLY:
            if getattr(config, key) != getattr(self.config, key):
                log.warning("reload: %s changed; it takes effect at the next restart", _pascal(key))
                setattr(config, key, getattr(self.config, key))

    # --- systemd ------------------------------------------------------------------------------

    def status_text(self) -> str:
        """The STATUS= line: what `systemctl status ppmq` shows an operator."""
        state = self.broker.state
        ready = sum(sum(s.ready) for subs in state.subs.values() for s in subs.values())
        inflight = sum(s.inflight for subs in state.subs.values() for s in subs.values())
        delayed = sum(s.delayed for subs in state.subs.values() for s in subs.values())
        paused = sum(s.paused for subs in state.subs.values() for s in subs.values())
        connected = sum(link.connected for link, _ in self.links.values())
        text = (
            f"{len(self.config.topics)} topics, {ready} ready, {delayed} delayed, {inflight} in flight,"
            f" {connected}/{len(self.links)} subscribers connected, {paused} subscriptions paused"
        )
        return f"{text}; last error: {self.last_error}" if self.last_error else text

    async def _report_status(self) -> None:
        """Refresh STATUS= when it changed; read only between steps, when the
        writer thread is not changing the counters."""
        shown = ""
        while True:
            await asyncio.sleep(STATUS_EVERY_S)
            if self.writer.busy:
                continue
            text = self.status_text()
            if text != shown:
                self.notifier.status(text)
                shown = text

    # --- metrics --------------------------------------------------------------------------------

    def _complete_status(self, body: dict) -> None:
        """What STATUS takes from this process rather than the store (PROTOCOL §8,
        §9, §10): whether each subscriber is connected, its takers, the commit
        times, and each listener's connections (and PhpmqSocket's frames to
        unknown queues). Runs on the writer thread; it only reads flags and
        counters and copies the dicts the event loop may change meanwhile."""
        connected = {name for name, (link, _) in dict(self.links).items() if link.connected}
        for topic in body["Topics"].values():
            for name, sub in topic["Subscribers"].items():
                sub["Connected"] = name in connected
        self.takes.complete_status(body)
        body["CommitSeconds"] = self.commit_times.body()
        listeners = {name: {"Connections": count} for name, count in dict(self.connections.open).items()}
        if self.phpmq is not None:
            self.phpmq.complete_status(listeners)
        body["Listeners"] = listeners

    async def _write_metrics_every(self, interval_s: float) -> None:
        """At once, so the file exists from the start, then every Interval."""
        while True:
            await self._write_metrics()
            await asyncio.sleep(interval_s)

    async def _write_metrics(self) -> None:
        """One STATUS step, rendered to Metrics.Textfile. A failed write is
        logged once (not every Interval) and never stops the broker."""
        assert self.config.metrics is not None, "metrics written without a Metrics section"
        path = self.config.metrics.textfile
        # Shielded: cancelled at stop while it waits, the call's future must still
        # be there to take the reply when the writer gives it.
        reply = await asyncio.shield(self.writer.call(p.Request(command="STATUS")))
        error = f"STATUS failed ({reply.status}): {reply.error}" if reply.status != 200 else ""
        if not error:
            try:
                write_textfile(path, exposition(reply.body))
            except OSError as exc:
                error = str(exc)
        if error and error != self._metrics_error:
            log.warning("metrics: cannot write %s: %s", path, error)
        elif self._metrics_error and not error:
            log.info("metrics: writing %s again", path)
        self._metrics_error = error

    async def _watchdog(self, interval_s: float) -> None:
        """WATCHDOG=1 from the event loop, only while the writer commits or idles
        normally: a stuck loop or a stuck disk stops the pings, and systemd restarts us."""
        while True:
            if self.writer.healthy(interval_s):
                self.notifier.watchdog()
            else:
                log.error("writer stuck for over %.1fs; withholding the watchdog ping", interval_s)
            await asyncio.sleep(interval_s)


def _moved(old: SubscriberConfig, new: SubscriberConfig) -> bool:
    """A subscriber's links must start again: another socket, or another number of connections."""
    return (old.socket, old.connections) != (new.socket, new.connections)


def _pascal(key: str) -> str:
    return "".join(part.capitalize() for part in key.split("_"))


def _summary(old: Config, new: Config) -> str:
    """What a reload changed, in a line."""
    parts = []
    for kind, before, after in (
        ("topics", {t.name for t in old.topics}, {t.name for t in new.topics}),
        ("subscribers", {s.name for s in old.subscribers}, {s.name for s in new.subscribers}),
    ):
        added, removed = sorted(after - before), sorted(before - after)
        if added:
            parts.append(f"{kind} added: {', '.join(added)}")
        if removed:
            parts.append(f"{kind} removed: {', '.join(removed)}")
    return "; ".join(parts) or "no topics or subscribers added or removed"
