"""The keeper of a partitioned read's store copy (pipeline/snapshot.py): the copy
lasts as long as the Spark driver that planned it, however that driver ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ppmq.pipeline import snapshot


def gone_within(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


def test_the_copy_outlives_its_reads_and_goes_when_the_driver_is_killed(tmp_path):
    # Given a copy, and a keeper watching the process that stands for the Spark driver
    copy = tmp_path / "ppmq-snapshot-x"
    copy.mkdir()
    (copy / "data.mdb").write_bytes(b"pages")
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _, _, start = snapshot._stat(driver.pid)
    keeper = subprocess.Popen([sys.executable, "-m", "ppmq.pipeline.snapshot", str(copy), str(driver.pid), str(start)])
    try:
        # While the driver lives, the copy stays
        assert not gone_within(copy, 2 * snapshot.KEEPER_POLL_S)
        # When the driver dies with kill -9, the copy goes, and so does the keeper
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert gone_within(copy, 10 * snapshot.KEEPER_POLL_S)
        assert keeper.wait(timeout=10) == 0
    finally:
        for p in (driver, keeper):
            if p.poll() is None:
                p.kill()


def test_a_pid_reused_by_another_process_does_not_keep_the_copy(tmp_path):
    # Given a keeper told a start time that is not the live process's (its pid was reused)
    copy = tmp_path / "ppmq-snapshot-y"
    copy.mkdir()
    # When it looks, it deletes the copy at once
    snapshot.keep(str(copy), os.getpid(), snapshot._stat(os.getpid())[2] + 1)
    assert not copy.exists()
