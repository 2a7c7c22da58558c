"""A local SparkSession that stays on loopback, for `ppmq report` and the tests.

Spark's defaults bind the driver to the host's public address and open a web UI
on *:4040; a report run on an operator's host should open nothing to the
network. On a cluster, spark-submit's own configuration applies instead
(`submit.py`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

LOOPBACK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
}


# The report's aggregations all spill to disk, so a fixed heap serves any journal size;
# its aggregates are small, so a few shuffle partitions (not 200) keep their stages short.
REPORT_CONF = {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "8"}


def local_session(master: str = "local[*]", app: str = "ppmq", log_level: str = "ERROR", **conf: str) -> SparkSession:
    """A session on this host only; workers run this interpreter, which has ppmq installed."""
    # Without it, workers run the first python3 on PATH, which may lack ppmq, lmdb and pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # also quiets the "resolves to a loopback address" warning
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in {**LOOPBACK_CONF, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark


@contextmanager
def stderr_to(path: str) -> Iterator[None]:
    """Point file descriptor 2 at `path` while the block starts the JVM, then back.

    The JVM inherits it for its whole life, so what it prints itself (log4j's
    banner, warnings, the JDK's notes) goes to `path`, and Python's own stderr
    stays the terminal's: setLogLevel cannot reach what is printed before it runs."""
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)
