"""This ppmq's version, as installed: what PING answers and the man pages carry."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def ppmq_version() -> str:
    try:
        return version("ppmq")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
