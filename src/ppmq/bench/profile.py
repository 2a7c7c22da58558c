"""A py-spy profile (collapsed stacks) of the broker, summed up where it matters:
CPU per thread, the functions that burn it themselves, and the ppmq functions
whose calls (with everything under them) take it."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")
_OURS = {p.name for p in Path(__file__).parent.parent.glob("*.py")} - {"cli/main.py", "__init__.py"}


def summary(path: Path, top: int = 15) -> str:
    threads: Counter[str] = Counter()  # samples per thread, per function itself, per ppmq function with its callees
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        threads[_thread_name(frames[0])] += n
        leaf[_name(frames[-1])] += n
        for name in {_name(f) for f in frames[1:] if _file(f) in _OURS}:
            inclusive[name] += n
    if not total:
        return "no samples"
    pct = lambda n: f"{100 * n / total:5.1f}%"  # noqa: E731
    lines = [f"{total} samples (waits in epoll and for the next step included)", "by thread:"]
    lines += [f"  {pct(n)}  {name}" for name, n in threads.most_common()]
    lines += ["functions themselves:"] + [f"  {pct(n)}  {name}" for name, n in leaf.most_common(top)]
    lines += ["ppmq functions with what they call:"] + [f"  {pct(n)}  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(lines)


def _thread_name(frame: str) -> str:
    return "writer" if "ppmq-writer" in frame or "_worker" in frame else frame.split(":")[-1].strip() or frame


def _file(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    return Path(m["file"]).name if m else ""


def _name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    return f"{m['func']} ({Path(m['file']).name})" if m else frame.strip()
