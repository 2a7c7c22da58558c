"""Whether the paths given to `ppmq report` hold journals, answered before Spark starts.

Spark takes seconds to start and then either fails on a missing path with its
own message or, on a directory without a journal, reads nothing and writes an
empty report. A local path is checked here instead, in a few milliseconds, and
named in the answer. A URI of another scheme (hdfs://, s3a://...) is left to
Spark, which alone reads it.

This module imports no pyspark: it runs before the session does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from urllib.parse import urlsplit

SUFFIXES = (".jsonl", ".jsonl.gz")  # of journal segments, as tables.read_journal reads them


def without_journals(paths: Iterable[str]) -> list[str]:
    """A sentence for each local path that does not exist or holds no journal segment."""
    problems = []
    for path in paths:
        local = _local(path)
        if local is None:
            continue
        if not os.path.exists(local):
            problems.append(f"{path}: no such file or directory")
        elif not _has_segment(local):
            problems.append(f"{path}: no journal here (no *{' or *'.join(SUFFIXES)} file, searched recursively)")
    return problems


def _local(path: str) -> str | None:
    """The file system path of a local path or file: URI; None for another scheme."""
    parts = urlsplit(path)
    if parts.scheme == "file":
        return parts.path
    return None if parts.scheme else path


def _has_segment(path: str) -> bool:
    if os.path.isfile(path):
        return path.endswith(SUFFIXES)
    return any(name.endswith(SUFFIXES) for _, _, files in os.walk(path) for name in files)
