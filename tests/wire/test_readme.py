"""The samples of README.md and of the docs pages it sends a newcomer to run as
written, against a broker started as `make serve` starts it.

The broker runs the Makefile's own `serve` commands in a copy of the tree (its
`ppmq.example.yaml`, its `.venv`), so sockets and data land under the copy's
`var/`. Then each page's fenced ```sh and ```python blocks run in order, as a
reader at a terminal would run them:

- a ```sh block runs in bash (`set -e`), in the reader's terminal: what one block
  exports or activates, and where it `cd`s, holds for the next, and on the next
  page;
- a ```python block runs with `python` in the tree's root, as a file;
- an HTML comment right before a block changes that:
  `<!-- sample: skip, WHY -->` does not run it (root, systemd, another host);
  `<!-- sample: file NAME -->` saves it as NAME for a later block to run;
  `<!-- sample: background until TEXT -->` runs it in a terminal of its own (a
  fresh environment), waits until its output shows TEXT, and stops it when the
  page is done.

Other blocks (```yaml, ```ini, ```text) are not run.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ppmq.client.library import Client
from ppmq.errors import ClientError
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
# README.md first, then the pages of its map that hold runnable samples, in the
# order a newcomer reads them: each continues in the terminal of the one before.
PAGES = ["README.md", "docs/clients.md", "docs/delivery.md", "docs/configuration.md", "docs/operations.md"]
# The pages whose samples need what a test run does not have.
NOT_RUN = {
    "docs/bridge.md": "a NATS JetStream server (tests/wire/test_bridge.py runs the bridge)",
    "docs/reports.md": "Spark and Java (tests/pipeline runs the report and spark-submit)",
    "docs/benchmarks.md": "peer brokers from apt and minutes of load",
    "docs/phpmq.md": "nothing to run: a config and the protocol",
}
# Pages that are not a newcomer's: the contract, the design and the figures.
REFERENCE = {"docs/protocol.md", "docs/design.md", "docs/performance.md", "docs/security.md", "docs/journal.md"}
RUN_S = 120.0
UNTIL_S = 30.0

pytestmark = pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs the virtualenv that make serve runs from")

FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!--[ \t]*sample:[ \t]*([^\n]*?)[ \t]*-->\s*\Z")


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str
    marker: str  # "" when there is none

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang})"


def blocks(page: str) -> list[Block]:
    text = (ROOT / page).read_text()
    found = []
    for m in FENCE.finditer(text):
        before = MARKER.search(text[: m.start()])
        indent, lang, code = m.groups()
        code = "".join(line.removeprefix(indent) for line in code.splitlines(keepends=True))
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, lang, code, before.group(1) if before else ""))
    return found


def runnable(page: str) -> list[Block]:
    return [b for b in blocks(page) if b.lang in ("sh", "python")]


@dataclass
class Terminal:
    """The reader's terminal: its environment and directory, kept across blocks."""

    tree: Path
    state: Path
    cwd: Path


def fresh_env(tree: Path) -> dict[str, str]:
    """What a new terminal has: no venv on PATH, no PPMQ_CONFIG. PYTHONPATH is
    passed on so that a checkout's sources are the ones under test."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tree), "LANG": "C.UTF-8", "TERM": "dumb"}
    env["PYTHONUNBUFFERED"] = "1"  # a terminal shows each line as printed; a file would not
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


@pytest.fixture(scope="module")
def tree() -> Iterator[Path]:
    """A fresh clone as far as `make serve` needs one: the example config, and the
    virtualenv `make serve` would have made (this one's). Short, for socket paths."""
    with tempfile.TemporaryDirectory(prefix="ppmq-") as d:
        root = Path(d) / "ppmq"
        root.mkdir()
        (root / "ppmq.example.yaml").write_text((ROOT / "ppmq.example.yaml").read_text())
        (root / ".venv").symlink_to(Path(sys.prefix))
        yield root


def serve_commands() -> list[str]:
    """The commands of the Makefile's `serve` recipe after its virtualenv is made."""
    lines = (ROOT / "Makefile").read_text().split("\nserve:", 1)[1].splitlines()[1:]
    recipe = [line.strip() for line in lines[: next(i for i, line in enumerate(lines) if not line.startswith("\t"))]]
    assert recipe == ["mkdir -p var/sub", "$(BIN)/ppmq serve -c ppmq.example.yaml"], recipe
    return [c.replace("$(BIN)", ".venv/bin") for c in recipe]


@pytest.fixture(scope="module")
def broker(tree: Path) -> Iterator[subprocess.Popen]:
    mkdir, serve = serve_commands()
    subprocess.run(mkdir, shell=True, cwd=tree, check=True)
    log = tree / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(shlex.split(serve), cwd=tree, env=fresh_env(tree), stdout=out, stderr=subprocess.STDOUT)
    try:

        def answers() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"make serve's broker exited: {log.read_text()}")
            try:
                with Client(str(tree / "var/ppmq.sock"), timeout_s=2) as c:
                    c.ping()
                return True
            except ClientError:
                return False

        wait_for(answers, 60, "the broker of make serve to answer")
        yield proc
        proc.send_signal(signal.SIGINT)  # Ctrl-C in the terminal of make serve: a clean stop
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def terminal(tree: Path) -> Terminal:
    state = tree.parent / "terminal.env"
    state.write_text("".join(f"export {k}={_quote(v)}\n" for k, v in fresh_env(tree).items()))
    return Terminal(tree, state, tree)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def _failed(block: Block, proc: subprocess.CompletedProcess | None, out: str) -> str:
    return f"{block} failed{'' if proc is None else f' (exit {proc.returncode})'}:\n{block.code}\n--- output:\n{out}"


def run_sh(term: Terminal, block: Block) -> None:
    script = (
        f"source {term.state}\ncd {_quote(str(term.cwd))}\nset -e -o pipefail\n{block.code}\n"
        f"set +e\nexport -p > {term.state}\npwd > {term.state}.cwd\n"
    )
    proc = subprocess.run(["bash", "-c", script], env={}, capture_output=True, text=True, timeout=RUN_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, _failed(block, proc, proc.stdout + proc.stderr)
    term.cwd = Path(Path(f"{term.state}.cwd").read_text().strip())


def run_python(term: Terminal, block: Block) -> None:
    path = term.tree.parent / "sample.py"
    path.write_text(block.code)
    python = term.tree / ".venv/bin/python"
    env = fresh_env(term.tree)
    proc = subprocess.run([str(python), str(path)], cwd=term.tree, env=env, capture_output=True, text=True, timeout=RUN_S)
    assert proc.returncode == 0, _failed(block, proc, proc.stdout + proc.stderr)


def start_background(term: Terminal, block: Block, until: str) -> subprocess.Popen:
    """In a terminal of its own: a fresh environment, the tree's root."""
    out = term.tree.parent / f"background-{block.line}.out"
    script = f"set -e -o pipefail\n{block.code}"
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            ["bash", "-c", script], cwd=term.tree, env=fresh_env(term.tree), stdout=f, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def shown() -> bool:
        if until in out.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            raise AssertionError(_failed(block, None, out.read_text(errors="replace")))
        return False

    try:
        wait_for(shown, UNTIL_S, f"{until!r} from {block}")
    except AssertionError as exc:
        stop(proc)
        raise AssertionError(f"{exc}\n{block.code}\n--- output:\n{out.read_text(errors='replace')}") from None
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("page", PAGES)
def test_every_sample_of_the_page_runs_as_written(broker: subprocess.Popen, terminal: Terminal, page: str) -> None:
    background: list[subprocess.Popen] = []
    try:
        for block in runnable(page):
            if block.marker.startswith("skip"):
                continue
            if block.marker.startswith("file "):
                (terminal.tree / block.marker.removeprefix("file ").strip()).write_text(block.code)
            elif block.marker.startswith("background until "):
                background.append(start_background(terminal, block, block.marker.removeprefix("background until ")))
            elif block.marker:
                raise AssertionError(f"{block}: unknown marker {block.marker!r}")
            elif block.lang == "sh":
                run_sh(terminal, block)
            else:
                run_python(terminal, block)
            assert broker.poll() is None, f"the broker exited after {block}"
    finally:
        for proc in reversed(background):
            stop(proc)


def test_the_samples_not_run_are_few_and_say_why() -> None:
    """Only what needs root, systemd or another host is skipped, each with its reason."""
    skipped = [b for page in PAGES for b in runnable(page) if b.marker.startswith("skip")]
    for b in skipped:
        assert re.fullmatch(r"skip, \S.*", b.marker), f"{b}: say why it is not run"
    assert [b for b in skipped if b.page == "README.md"] == [b for b in skipped if b.page == "README.md" and "make" in b.code]
    assert len(skipped) <= 8, [str(b) for b in skipped]


def test_every_page_of_the_docs_is_run_or_says_why_not() -> None:
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    assert pages == (set(PAGES) | set(NOT_RUN) | REFERENCE) - {"README.md"}


def test_every_code_block_is_fenced_with_its_language() -> None:
    """An indented block would be neither run nor skipped: only fences are samples."""
    for page in [*PAGES, *NOT_RUN]:
        for b in blocks(page):
            assert b.lang, f"{b}: give the fence a language (sh, python, yaml, ini, text)"
