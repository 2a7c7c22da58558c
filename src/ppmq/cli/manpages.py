"""The manual pages ppmq(1) and ppmq.yaml(5), generated so that they cannot drift.

ppmq(1) is made from the command line's own argparse parser: every command, its
arguments and options with their help. ppmq.yaml(5) is made from the config
Structs (every key, its type and its default) and the comments of
ppmq.example.yaml, which documents every key above its line; a key without
such a comment is an error, so a new key cannot ship undocumented.

    python -m ppmq.cli.manpages OUTDIR --example ppmq.example.yaml

writes OUTDIR/man1/ppmq.1.gz and OUTDIR/man5/ppmq.yaml.5.gz (gzip -9, no
timestamp: the same sources give the same bytes).
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from ppmq.config import Config, Duration, FileMode, JournalConfig, MetricsConfig, Size, SubscriberConfig, TopicConfig, ZbusKey
from ppmq.errors import ManPageError
from ppmq.version import ppmq_version

# The config Structs, each with where its keys sit in the file.
SECTIONS = (
    ("TOP-LEVEL KEYS", "", Config),
    ("JOURNAL", "Journal.", JournalConfig),
    ("METRICS", "Metrics.", MetricsConfig),
    ("SUBSCRIBERS", "Subscribers[].", SubscriberConfig),
    ("TOPICS", "Topics[].", TopicConfig),
    ("ZBUS KEYS", "ZbusKeys[].", ZbusKey),
)
_KEY = re.compile(r"^(?P<indent>\s*)(?P<item>- )?(?P<key>[A-Z][A-Za-z]*):(?:\s|$)")


def _roff(text: str) -> str:
    """Text safe in a roff line: backslashes and hyphens escaped, no leading dot."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def _header(name: str, section: int, title: str, summary: str) -> list[str]:
    return [
        f'.TH {name.upper()} {section} "" "ppmq {ppmq_version()}" "{title}"',
        ".SH NAME",
        f"{_roff(name)} \\- {_roff(summary)}",
    ]


# --- ppmq(1) -----------------------------------------------------------------------


def command_page(parser: argparse.ArgumentParser, subparsers: dict[str, argparse.ArgumentParser]) -> str:
    """ppmq(1): the synopsis, then every command with its arguments and options."""
    lines = _header("ppmq", 1, "User Commands", "persistent, prioritized message broker for one host")
    lines += [".SH SYNOPSIS", ".B ppmq", "\\fICOMMAND\\fR [\\fIOPTION\\fR]... [\\fIARGUMENT\\fR]...", ".SH DESCRIPTION"]
    lines.append(
        _roff(
            "ppmq takes JSON batches on a Unix socket, stores them in LMDB, and pushes them by priority and "
            "publish order to one Unix socket per subscriber. `ppmq serve` is the broker; the other commands "
            "talk to a running broker, check a config or a store, or report on delivery journals."
        )
    )
    lines.append(".SH COMMANDS")
    for sub in _leaves(subparsers.values()):
        usage = " ".join(sub.format_usage().removeprefix("usage: ").split())  # argparse wraps it
        lines += [f'.SS "{_roff(usage)}"', _roff(sub.description or ""), ".PP"]
        lines += _options(sub)
        if sub.epilog:  # its examples, laid out as --help shows them
            lines += [".PP", ".nf", *map(_roff, sub.epilog.splitlines()), ".fi"]
    lines.append('.SS "ppmq bench [OPTION]..."')
    lines.append(_roff("Runs named workloads against ppmq and peer brokers on this host; `ppmq bench --help` lists its options."))
    lines += [
        ".SH ENVIRONMENT",
        ".TP",
        ".B PPMQ_CONFIG",
        _roff("The config file when -c is not given; then /etc/ppmq/ppmq.yaml."),
        ".SH EXIT STATUS",
        _roff("0 when the command did its job, 1 when the request failed (the broker's error on standard error), 2 for a usage error."),
        ".SH FILES",
        ".TP",
        ".I /etc/ppmq/ppmq.yaml",
        _roff("The service's config, see ppmq.yaml(5)."),
        ".TP",
        f".I {_roff('/usr/share/bash-completion/completions/ppmq')}",
        ".PD 0",
        ".TP",
        f".I {_roff('/usr/share/zsh/vendor-completions/_ppmq')}",
        ".PD",
        _roff("Tab completion of the commands, their options and file arguments, for bash and for zsh."),
        ".SH SEE ALSO",
        ".BR ppmq.yaml (5),",
        ".BR systemctl (1),",
        _roff("/usr/share/doc/ppmq/README.md"),
    ]
    return "\n".join(lines) + "\n"


def _leaves(parsers: Iterable[argparse.ArgumentParser]) -> Iterator[argparse.ArgumentParser]:
    """Each command, or in its place each of its own subcommands (`bridge to`, `bridge from`),
    since those are what a reader types and where the arguments are."""
    for parser in parsers:
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            yield from _leaves(nested[0].choices.values())
        else:
            yield parser


def _options(sub: argparse.ArgumentParser) -> list[str]:
    lines = []
    for action in sub._actions:  # argparse keeps no public list of a parser's arguments
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else f" {_metavar(action)}"
            label = ", ".join(f"\\fB{_roff(o)}\\fR" for o in action.option_strings) + _roff(metavar)
        else:
            label = f"\\fI{_roff(_metavar(action))}\\fR"
        lines += [".TP", label, _roff(action.help or "")]
    return lines


def _metavar(action: argparse.Action) -> str:
    """What stands for an argument's value, as argparse's usage writes it: its
    metavar (a tuple of them for several values), or its name in capitals."""
    if isinstance(action.metavar, tuple):
        return " ".join(action.metavar)
    return action.metavar or action.dest.upper()


# --- ppmq.yaml(5) -------------------------------------------------------------------


def documented_keys(example: str) -> dict[str, str]:
    """Each key of the example file (`Topics.MaxAttempts`) with the comment above it;
    a commented-out key (`# Users: [printer]`) counts, so optional keys are documented
    too, and so does a commented-out section (`# Metrics:`) with its keys."""
    known = {f.encode_name for _, _, struct in SECTIONS for f in msgspec.structs.fields(struct)}
    docs: dict[str, str] = {}
    comment: list[str] = []
    parents: list[tuple[int, str]] = []
    for raw in example.splitlines():
        stripped = raw.strip()
        if not stripped:
            comment = []
            continue
        commented = stripped.startswith("#")
        m = _KEY.match(raw.replace("# ", "", 1) if commented else raw)
        if m is None or (commented and m["key"] not in known):
            if commented:
                comment.append(stripped.lstrip("# \t"))  # "#   # ..." inside a commented-out section
            continue
        indent = len(m["indent"]) + (2 if m["item"] else 0)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = ".".join([key for _, key in parents] + [m["key"]])
        if comment and path not in docs:
            docs[path] = " ".join(comment)
        comment = []
        if not commented or not raw.partition(":")[2].strip():
            parents.append((indent, m["key"]))
    return docs


def config_page(example: str) -> str:
    """ppmq.yaml(5): every key of every config Struct, with type, default and meaning."""
    docs = documented_keys(example)
    lines = _header("ppmq.yaml", 5, "File Formats", "configuration of the ppmq message broker")
    lines += [
        ".SH DESCRIPTION",
        _roff(
            "The broker reads one YAML file (ppmq serve -c FILE, default /etc/ppmq/ppmq.yaml). ppMQ's keys are read "
            'unchanged; the others are extensions. Durations are Go-style strings ("90s", "1h30m") or seconds; '
            'sizes are bytes or strings with a unit ("16MiB"). Relative paths are relative to the file\'s directory. '
            "An unknown key, a wrong type or an unknown subscriber named by a topic is an error that names the file, "
            "the line and the key; `ppmq check -c FILE` checks a file, and `systemctl reload ppmq` applies one."
        ),
    ]
    missing = []
    for title, prefix, struct in SECTIONS:
        lines.append(f".SH {title}")
        for f in msgspec.structs.fields(struct):
            if f.type in (JournalConfig, MetricsConfig | None, list[SubscriberConfig], list[TopicConfig]):
                continue  # a section of its own
            key = prefix.replace("[]", "") + f.encode_name
            doc = docs.get(key)
            if doc is None:
                missing.append(prefix + f.encode_name)
                continue
            lines += [".TP", f"\\fB{_roff(f.encode_name)}\\fR ({_roff(_type_name(f.type))}{_roff(_default(f))})", _roff(doc)]
    if missing:
        raise ManPageError(f"keys without a comment in ppmq.example.yaml: {', '.join(missing)}")
    lines += [".SH SEE ALSO", ".BR ppmq (1),", _roff("/usr/share/doc/ppmq/README.md")]
    return "\n".join(lines) + "\n"


_TYPE_NAMES = {Duration: "duration", Size: "size", FileMode: "octal mode", bool: "boolean", int: "integer", str: "string"}


def _type_name(tp: Any) -> str:
    if tp in _TYPE_NAMES:
        return _TYPE_NAMES[tp]
    args = getattr(tp, "__args__", ())
    if getattr(tp, "__origin__", None) is list:
        return "list of " + ("names or uids" if args and args[0] is not str else "names")
    named = [a for a in args if a is not type(None)]
    return _type_name(named[0]) if len(named) == 1 else "value"


def _default(f: msgspec.structs.FieldInfo) -> str:
    if f.required:
        return ", required"
    value = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
    if value is None or value == []:
        return ""
    return f", default {_value(f.type, value)}"


def _value(tp: Any, value: Any) -> str:
    """A default as the file would spell it."""
    if tp is FileMode:
        return f"0{value:o}"
    if tp is Size:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % size == 0:
                return f"{value // size}{unit}"
    if tp is Duration:
        return f"{value:g}s"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


# --- writing them -------------------------------------------------------------------


def write(out: Path, example: Path) -> list[Path]:
    """Write both pages, gzipped, under out/man1 and out/man5."""
    from ppmq.cli.main import _parser  # the command line's own parser

    parser, subparsers = _parser()
    pages = {
        out / "man1" / "ppmq.1.gz": command_page(parser, subparsers),
        out / "man5" / "ppmq.yaml.5.gz": config_page(example.read_text()),
    }
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    return list(pages)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ppmq.cli.manpages", description="write ppmq(1) and ppmq.yaml(5), gzipped")
    ap.add_argument("out", type=Path, help="directory that gets man1/ and man5/")
    ap.add_argument("--example", type=Path, default=Path("ppmq.example.yaml"), help="the documented example config")
    args = ap.parse_args(argv)
    try:
        for path in write(args.out, args.example):
            print(path)
    except ManPageError as exc:
        print(f"manpages: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
