"""The command line explains itself: every argument has help text, every command an
example, and only the commands that talk to the broker take -s."""

from __future__ import annotations

import argparse

import pytest

from ppmq.cli.main import _parser
from ppmq.cli.manpages import _leaves

_, SUBPARSERS = _parser()
LEAVES = {sub.prog.removeprefix("ppmq "): sub for sub in _leaves(SUBPARSERS.values())}


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_every_argument_of_every_command_has_help_text(name):
    undocumented = [a.dest for a in LEAVES[name]._actions if not isinstance(a, argparse._HelpAction) and not a.help]
    assert undocumented == []


@pytest.mark.parametrize("name", sorted([*LEAVES, "bridge"]))
def test_every_command_ends_its_help_with_an_example_of_itself(name):
    parser = LEAVES.get(name) or SUBPARSERS[name]
    assert parser.epilog is not None and parser.epilog.startswith("example:\n  "), parser.epilog
    assert f"ppmq {name}" in parser.epilog


@pytest.mark.parametrize("name", ["check", "reload", "fsck", "migrate"])
def test_a_command_that_never_asks_the_broker_offers_no_socket_option(name):
    options = {o for a in SUBPARSERS[name]._actions for o in a.option_strings}
    assert "-c" in options and not options & {"-s", "--socket"}
