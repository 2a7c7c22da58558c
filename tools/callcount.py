"""Run a Python module with every function call counted, Python and C alike.

    python tools/callcount.py OUT.json -m MODULE [ARGS...]

Counts what cProfile counts (a call event for each Python function, a c_call
event for each builtin), on every thread, and writes the counts as JSON to OUT
when the program exits normally (ppmq serve does on SIGTERM): a Python call
under its function's file, a builtin under the file of the function calling it. tools/paced.py
--calls runs the broker under it twice and takes the difference.
"""

from __future__ import annotations

import atexit
import collections
import json
import runpy
import sys
import threading


def main() -> None:
    out, flag, module, *args = sys.argv[1:]
    if flag != "-m":
        sys.exit(__doc__)
    counts: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":
            counts[frame.f_code.co_filename, frame.f_code.co_name, ""] += 1
        elif event == "c_call":
            counts["<C>", getattr(arg, "__qualname__", repr(arg)), frame.f_code.co_filename] += 1

    def dump() -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        with open(out, "w") as f:
            json.dump([[where, name, caller, n] for (where, name, caller), n in counts.items()], f)

    atexit.register(dump)
    sys.argv = [module, *args]
    threading.setprofile(profile)
    sys.setprofile(profile)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
