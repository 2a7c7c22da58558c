"""A broker under test as a child process: started, waited for, stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from ppmq.errors import StartError

START_TIMEOUT_S = 60.0  # RabbitMQ takes several seconds on a busy machine
STOP_TIMEOUT_S = 30.0


class Service:
    """One broker process (and whatever it forks), logging to a file in its directory."""

    def __init__(self, argv: list[str], workdir: Path, env: Mapping[str, str] | None = None) -> None:
        self.log_path = workdir / "server.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_unix(self, path: str) -> None:
        self._wait(lambda: _connects(socket.AF_UNIX, path), path)

    def wait_tcp(self, port: int) -> None:
        self._wait(lambda: _connects(socket.AF_INET, ("127.0.0.1", port)), f"127.0.0.1:{port}")

    def _wait(self, ready, where: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise StartError(f"{where} did not come up; log:\n{self.log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, as a service manager would; SIGKILL to its process group if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: only what it forked
        except ProcessLookupError:
            pass
        self.proc.wait()


class Running(NamedTuple):
    """A started broker: how clients reach it, and where it keeps its data."""

    service: Service
    address: dict  # passed to the client processes as JSON
    data_dir: Path
    version: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connects(family: int, address) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.connect(address)
            return True
        except OSError:
            return False
