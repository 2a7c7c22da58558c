"""`ppmq report` and the spark-submit entry script, as an operator runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ppmq.pipeline.session
import ppmq.pipeline.submit
from ppmq.cli.main import main


@pytest.fixture
def no_spark(monkeypatch):
    """Starting a session fails the test: the paths are judged before Spark starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("Spark started")

    monkeypatch.setattr(ppmq.pipeline.session, "local_session", refuse)


def test_ppmq_report_names_a_path_that_does_not_exist(tmp_path, capsys, no_spark) -> None:
    assert main(["report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ppmq report: ") and "nowhere: no such file or directory" in err


def test_ppmq_report_on_a_path_without_a_journal_says_so_before_starting_spark(tmp_path, capsys, no_spark) -> None:
    journals = tmp_path / "journals"
    (journals / "web1").mkdir(parents=True)
    (journals / "web1" / "notes.txt").write_text("not a journal")
    (tmp_path / "db1").mkdir()
    (tmp_path / "db1" / "0001.jsonl.gz").write_bytes(b"")
    assert main(["report", str(tmp_path / "db1"), str(journals), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err == f"ppmq report: {journals}: no journal here (no *.jsonl or *.jsonl.gz file, searched recursively)\n"
    assert not (tmp_path / "out").exists()


def test_the_entry_script_says_so_too_before_starting_spark(tmp_path, capsys) -> None:
    assert ppmq.pipeline.submit.main(["--out", str(tmp_path / "out"), str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"ppmq-report: {tmp_path}: no journal here (no *.jsonl or *.jsonl.gz file, searched recursively)\n"


@pytest.mark.slow  # a JVM of its own: `make test-slow`
def test_spark_submit_runs_the_entry_script(workload, tmp_path) -> None:
    """The README's spark-submit command, on a local master."""
    out = tmp_path / "out"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYSPARK_PYTHON": sys.executable}
    command = [
        str(bin_dir / "spark-submit"), "--master", "local[2]",
        "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
        ppmq.pipeline.submit.__file__, "--out", str(out), *map(str, workload.journals),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "events from 2 hosts" in done.stdout
    assert (out / "report.html").exists() and (out / "subscribers").is_dir()


def test_ppmq_report_without_pyspark_says_what_to_install_and_exits_2(tmp_path) -> None:
    # The broker's own install has no PySpark: an import of it fails as it would there
    code = "import sys; sys.modules['pyspark'] = None; from ppmq.cli.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "report", str(tmp_path), "--out", str(tmp_path / "out")], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "pip install 'ppmq[spark]'" in done.stderr and "Java 17" in done.stderr
