"""The README's two commands, as make would run them on a fresh clone (`make -n -B`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not shutil.which("make"), reason="make is not installed")


def planned(target: str) -> str:
    """Every command `make TARGET` would run from scratch, without running any
    (also from inside `make test`, whose settings a child make would inherit)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    argv = ["make", "--no-print-directory", "-n", "-B", target]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout


def test_make_serve_installs_the_broker_alone_without_java_or_spark() -> None:
    commands = planned("serve")
    assert "pip install --quiet -e .\n" in commands
    assert "ppmq serve -c ppmq.example.yaml" in commands
    assert "spark" not in commands and "java" not in commands and "openjdk" not in commands
    assert "bridge" not in commands


def test_make_test_installs_the_test_tools_spark_the_bridge_and_java_then_runs_every_test() -> None:
    commands = planned("test")
    assert "pip install --quiet -e '.[test,spark,bridge]'" in commands
    assert "openjdk-17-jre-headless" in commands
    assert commands.splitlines()[-1].endswith("-m pytest -q")


def test_make_test_lints_checks_the_format_and_the_types_before_the_tests() -> None:
    commands = planned("test").splitlines()
    checks = [i for i, line in enumerate(commands) if "ruff check ." in line or "ruff format --check ." in line or line.endswith("/mypy")]
    assert len(checks) == 3 and max(checks) < len(commands) - 1
