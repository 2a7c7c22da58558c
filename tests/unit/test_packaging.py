"""What the packages ship, checked from the sources: the config installed as
/etc/ppmq/ppmq.yaml, the examples that go into it, the project's licence metadata,
and what `make package` and `make test-package` install first."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_makefile import planned

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "packaging" / "ppmq.yaml"
UNITS = ROOT / "systemd"
EXAMPLES = sorted((ROOT / "examples").glob("*/ppmq.yaml"))


def unit_values(unit: Path, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.read_text().splitlines() if line.startswith(f"{key}=")]


def check(tmp_path: Path, text: str) -> str:
    """`ppmq check` of a config with TEXT; its output, which must say ok."""
    config = tmp_path / "ppmq.yaml"
    config.write_text(text)
    done = subprocess.run([sys.executable, "-m", "ppmq.cli", "check", "-c", str(config)], capture_output=True, text=True)
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout + done.stderr + text
    return done.stdout


def paste(config: str, example: str) -> str:
    """CONFIG with EXAMPLE's Subscribers and Topics items in its lists, as a
    user pastes them: each `KEY: []` line becomes the example's block of that key."""
    for key in ("Subscribers", "Topics"):
        block = re.search(rf"^{key}:\n(?:[ #].*\n|\n)*", example, re.MULTILINE)
        assert block, f"no {key} block in the example"
        config, n = re.subn(rf"^{key}: \[\]\n", block.group(0).rstrip("\n") + "\n", config, flags=re.MULTILINE)
        assert n == 1, f"the shipped config has no `{key}: []` line"
    return config


def test_the_shipped_config_passes_check_with_no_subscribers_and_no_topics(tmp_path: Path) -> None:
    """A real host has none of the examples' handlers: nothing may queue up for them."""
    assert "(0 topics, 0 subscribers)" in check(tmp_path, SHIPPED.read_text())
    config = yaml.safe_load(SHIPPED.read_text())
    assert (config["Subscribers"], config["Topics"]) == ([], [])


def test_the_shipped_config_uses_the_socket_and_the_state_directory_of_the_units() -> None:
    config = yaml.safe_load(SHIPPED.read_text())
    assert unit_values(UNITS / "ppmq.socket", "ListenStream") == [config["ServerSocket"]]
    assert [f"/var/lib/{d}" for d in unit_values(UNITS / "ppmq.service", "StateDirectory")] == [config["DataPath"]]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.parent.name)
def test_each_example_pasted_into_the_shipped_config_passes_check(tmp_path: Path, example: Path) -> None:
    merged = paste(SHIPPED.read_text(), example.read_text())
    check(tmp_path, merged)
    config, part = yaml.safe_load(merged), yaml.safe_load(example.read_text())
    assert (config["Subscribers"], config["Topics"]) == (part["Subscribers"], part["Topics"])


@pytest.mark.parametrize("base", [SHIPPED, ROOT / "ppmq.example.yaml"], ids=["shipped", "example"])
def test_every_example_together_in_a_config_passes_check(tmp_path: Path, base: Path) -> None:
    """The examples use names of their own: none repeats a subscriber or a topic of
    another example, of the shipped config, or of ppmq.example.yaml, the config
    with every key that a site may start from."""
    config: dict[str, Any] = yaml.safe_load(base.read_text())
    for example in EXAMPLES:
        part = yaml.safe_load(example.read_text())
        config["Subscribers"] += part["Subscribers"]
        config["Topics"] += part["Topics"]
    for key in ("Subscribers", "Topics"):
        names = [item["Name"] for item in config[key]]
        assert len(names) == len(set(names)), f"{key}: {names}"
    assert len(EXAMPLES) >= 2
    check(tmp_path, yaml.safe_dump(config))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.parent.name)
def test_each_example_subscriber_socket_is_where_its_socket_unit_listens(example: Path) -> None:
    """An example's own socket unit if it has one, else ppmq-subscriber@NAME.socket."""
    for sub in yaml.safe_load(example.read_text())["Subscribers"]:
        own = example.parent / f"ppmq-{sub['Name']}.socket"
        if own.exists():
            assert unit_values(own, "ListenStream") == [sub["Socket"]]
        else:
            (template,) = unit_values(UNITS / "ppmq-subscriber@.socket", "ListenStream")
            assert sub["Socket"] == template.replace("%i", sub["Name"])


def test_the_project_licence_is_an_spdx_expression_with_its_text() -> None:
    """A licence table is deprecated by setuptools, which then prints a banner on
    every `pip install -e .`; the string form needs setuptools 77."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "MIT"
    for pattern in pyproject["project"]["license-files"]:
        assert list(ROOT.glob(pattern)), pattern
    (setuptools,) = [r for r in pyproject["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", setuptools)
    assert minimum and int(minimum.group(1)) >= 77, setuptools


needs_make = pytest.mark.skipif(not shutil.which("make"), reason="make is not installed")


@needs_make
def test_make_package_installs_the_build_tools_alone() -> None:
    commands = planned("package")
    assert "packaging/install-tools.sh .venv" in commands
    assert "packaging/build.sh dist deb" in commands
    for unwanted in ("java", "openjdk", "chromium", "spark", "[test", "pip install"):
        assert unwanted not in commands, unwanted


@needs_make
def test_make_test_package_installs_the_broker_and_pytest_but_not_the_rest_of_the_test_stack() -> None:
    commands = planned("test-package")
    assert "pip install --quiet -e .\n" in commands and "pip install --quiet 'pytest>=8'" in commands
    for unwanted in ("java", "openjdk", "chromium", "spark", "[test"):
        assert unwanted not in commands, unwanted
    assert commands.splitlines()[-1].endswith("-m pytest -q tests/packaging")
