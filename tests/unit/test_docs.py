"""README.md and docs/: every relative link leads somewhere, and the README's command
table names every command of `ppmq --help`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from ppmq.cli.main import _parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^ *```.*?^ *```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text without code, where a `[x](y)` is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped but
    for - and _, spaces as -; a repeated heading gets -1, -2."""
    seen: dict[str, int] = {}
    found = set()
    for title in HEADING.findall(FENCE.sub("", page.read_text())):
        text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", title).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_and_an_anchor_that_exist(page: Path) -> None:
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: {target}: no such file"
        assert file.is_relative_to(ROOT), f"{page.name}: {target}: outside the repository"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{page.name}: {target}: no such heading in {file.name}"


def test_the_link_check_sees_the_links() -> None:
    readme = ROOT / "README.md"
    assert "docs/configuration.md" in links(readme)
    assert "try-it" in anchors(readme)
    assert "pull-subscribers-extension" in anchors(ROOT / "docs/protocol.md")


def test_every_command_of_ppmq_help_is_in_the_readmes_command_table() -> None:
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| command | does |") :].split("\n\n", 1)[0]
    listed = set(re.findall(r"^\| `ppmq ([a-z]+)", table, re.MULTILINE))
    parser, _ = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helped = set(commands.choices)  # what `ppmq --help` lists, bench included
    assert "bench" in helped and "serve" in helped
    assert helped <= listed, sorted(helped - listed)
    assert listed <= helped, sorted(listed - helped)
    assert "| `ppmq --version` |" in table
