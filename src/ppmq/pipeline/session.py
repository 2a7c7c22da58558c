"""A local SparkSession that stays on loopback, for `ppmq report` and the tests.

Spark's defaults bind the driver to the host's public address and open a web UI
on *:4040; a report run on an operator's host should open nothing to the
network. On a cluster, spark-submit's own configuration applies instead
(`submit.py`).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

LOOPBACK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
}


def local_session(master: str = "local[*]", app: str = "ppmq", **conf: str) -> SparkSession:
    """A session on this host only; workers run this interpreter, which has ppmq installed."""
    # Without it, workers run the first python3 on PATH, which may lack ppmq, lmdb and pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # also quiets the "resolves to a loopback address" warning
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in {**LOOPBACK_CONF, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
