"""The systems under test, one module each, all with the same shape.

A system module has `NAME`, `missing()` (why it cannot run here, or None),
`start(tmp, workload) -> Running`, and the client sides run in their own
processes: `Publisher(address, workload)` with `publish(batch)` that returns once
the broker confirmed the batch, and `Subscriber(address, workload, index)` with
`prepare()` (before the publisher starts), `start()` (when it may read) and
`batches()`, which yields each batch's payloads and acknowledges it before
reading the next one (or in `close()`, which the bench calls before it stops
the clock). `batches()` yields an empty list after about a second without
messages, so that the caller can see that it has everything it will get.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

IDLE_S = 1.0  # how long batches() waits for messages before it yields []

NAMES = ("ppmq", "redis", "beanstalkd", "rabbitmq", "nats")


def load(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


def lacking(program: str | None, module: str | None = None) -> str | None:
    """Why a peer cannot run: its server program or its Python client is missing."""
    if program is None or not os.path.exists(program):
        return "server not installed (tools/install-peers.sh)"
    if module is not None and importlib.util.find_spec(module) is None:
        return f"Python package {module} not installed (pip install -e .[bench])"
    return None
