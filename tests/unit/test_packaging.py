"""What the packages ship, checked from the sources: the project's licence metadata."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
