"""Where the units and the example live in the repository, how a site lays them
out under /etc/systemd/system, and how the tests boot this host's OS under them."""

from __future__ import annotations

import shutil
import subprocess
import uuid
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


def boot_container(args: list[str], timeout_s: float) -> str:
    """Boot this host's root with systemd-nspawn, with ARGS (a --volatile= mode, the
    mounts, then --boot and init's arguments), until the container exits; what went
    wrong, or ''."""
    machine = f"ppmq-test-{uuid.uuid4().hex[:8]}"
    command = [
        "systemd-nspawn",
        "--quiet",
        "--register=no",
        "--keep-unit",
        "--console=pipe",
        "--directory=/",
        f"--machine={machine}",
        *args,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        return f"the container did not finish within {timeout_s}s\n{exc.stdout or ''}{exc.stderr or ''}"
    finally:
        # nspawn leaves the machine's propagation directory behind, and refuses to remove it itself.
        shutil.rmtree(f"/run/systemd/nspawn/propagate/{machine}", ignore_errors=True)
    return "" if done.returncode == 0 else f"the container exited with {done.returncode}\n{done.stdout}{done.stderr}"
