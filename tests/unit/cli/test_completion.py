"""Completion of `ppmq` for bash and zsh, generated from the parser: bash runs the
completion function as it would on a Tab, with COMP_WORDS and COMP_CWORD set,
and its COMPREPLY is read back; zsh parses its file, and completes a line typed
in a real terminal (tmux) when zsh and tmux are installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppmq.cli.completion import BASH_PATH, ZSH_PATH, main
from ppmq.cli.main import _parser

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("root")
    assert main(["--install", str(root)]) == 0
    return root


def help_commands() -> list[str]:
    """The commands `ppmq --help` lists, as a user reads them."""
    out = subprocess.run([sys.executable, "-m", "ppmq.cli", "--help"], capture_output=True, text=True, check=True).stdout
    listing = out.split("  COMMAND\n", 1)[1]  # under the heading of the commands
    return re.findall(r"^    (\w[\w-]*)", listing, re.M)


def complete(installed: Path, *lines: list[str]) -> list[list[str]]:
    """COMPREPLY for each line, the last word being the one completed, from one bash."""
    script = [f"source {installed / BASH_PATH}", "complete -p ppmq"]
    for words in lines:
        quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
        script += [f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; COMPREPLY=(); _ppmq", 'printf "%s\\n" "${COMPREPLY[*]}"']
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", "\n".join(script)], capture_output=True, text=True, cwd=installed)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "complete -F _ppmq ppmq"
    return [line.split() for line in out[1:]]


def test_help_lists_every_command_of_the_parser() -> None:
    commands = help_commands()
    assert "top" in commands and "take" in commands
    assert set(commands) == set(_parser()[1]) | {"bench"}


def test_bash_completes_every_command_of_help_from_nothing_and_from_its_first_letters(installed: Path) -> None:
    commands = help_commands()
    replies = complete(installed, ["ppmq", ""], *(["ppmq", name[:2]] for name in commands))
    assert sorted(replies[0]) == sorted(commands)
    for name, reply in zip(commands, replies[1:]):
        assert name in reply and all(r.startswith(name[:2]) for r in reply), (name, reply)


def test_bash_completes_every_option_of_every_command(installed: Path) -> None:
    _, subparsers = _parser()
    names = list(subparsers)
    replies = complete(installed, *(["ppmq", name, "-"] for name in names), ["ppmq", "bridge", "to", "--"])
    for name, reply in zip(names, replies):
        options = {o for a in subparsers[name]._actions for o in a.option_strings}
        assert options == set(reply), name
    assert set(replies[-1]) == {"--help", "--config", "--socket", "--subject-prefix"}


def test_bash_completes_subcommands_choices_and_files(installed: Path) -> None:
    (installed / "ppmq.yaml").write_text("")
    replies = complete(
        installed,
        ["ppmq", "bridge", ""],
        ["ppmq", "peek", "jobs", "--state", ""],
        ["ppmq", "top", "-c", "ppmq.y"],
        ["ppmq", "top", "--interval", ""],  # a duration: nothing to offer
        ["ppmq", "publish", "-c", "ppmq.yaml", "--priority", "1", "jobs", ""],  # a payload: nothing either
        ["ppmq", "top", "-c", "ppmq.yaml", "-"],  # the value of -c skipped: top's options
    )
    assert replies[:5] == [["to", "from"], ["ready", "inflight"], ["ppmq.yaml"], [], []]
    assert "--interval" in replies[5] and "--count" in replies[5]


def test_the_zsh_file_parses_and_names_every_command(installed: Path) -> None:
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    path = installed / ZSH_PATH
    text = path.read_text()
    assert text.startswith("#compdef ppmq\n")
    done = subprocess.run(["zsh", "-n", str(path)], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")
    for name in help_commands():
        assert f"\n        '{name}:" in text, name


def test_zsh_completes_a_command_and_an_option_value_in_a_terminal(installed: Path, tmp_path: Path) -> None:
    if shutil.which("zsh") is None or shutil.which("tmux") is None:
        pytest.skip("zsh and tmux are needed")
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    zsh = ["env", "-i", f"HOME={tmp_path}", "TERM=xterm", "PATH=/usr/bin:/bin", "zsh", "-f"]
    subprocess.run([*tmux, "-f", "/dev/null", "new-session", "-d", "-x", "100", "-y", "10", "-s", "z", *zsh], check=True)
    try:

        def keys(*typed: str) -> None:
            subprocess.run([*tmux, "send-keys", "-t", "z", *typed], check=True)

        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "z"], capture_output=True, text=True, check=True).stdout

        def until(pattern: str) -> str:
            deadline = time.monotonic() + 15
            while not re.search(pattern, text := screen(), re.M):
                assert time.monotonic() < deadline, f"no {pattern!r} on the screen:\n{text}"
                time.sleep(0.05)
            return text

        fpath = installed / ZSH_PATH.parent
        keys(f"fpath=({fpath} $fpath); autoload -Uz compinit; compinit -u; PS1='> '; clear", "Enter")
        until(r"^>$")  # capture-pane drops the spaces that end a line
        keys("ppmq pe", "Tab")
        until(r"^> ppmq peek$")
        keys("jobs --st", "Tab")
        until(r"^> ppmq peek jobs --state$")
        keys("Tab")
        until(r"^inflight\s+ready\s*$")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
