"""Where the units and the example live in the repository, and how a site lays
them out under /etc/systemd/system."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
EXAMPLE = REPO / "examples" / "subscriber"
PARALLEL = REPO / "examples" / "parallel"  # a socket unit with Accept=yes


def install_units(root: Path) -> Path:
    """Our units and the example's drop-in in ROOT/etc/systemd/system, which is returned."""
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    for unit in UNITS.glob("*.s*"):
        shutil.copy(unit, units)
    shutil.copytree(EXAMPLE / "ppmq-subscriber@archive.service.d", units / "ppmq-subscriber@archive.service.d")
    return units
