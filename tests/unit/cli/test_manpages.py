"""ppmq(1) and ppmq.yaml(5): made from the parser and the config Structs, complete,
and clean to groff."""

from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest

from ppmq.cli.main import _parser
from ppmq.cli.manpages import SECTIONS, config_page, documented_keys, main
from ppmq.errors import ManPageError

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = (ROOT / "ppmq.example.yaml").read_text()


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("man")
    assert main([str(out), "--example", str(ROOT / "ppmq.example.yaml")]) == 0
    return {p.name: gzip.decompress(p.read_bytes()).decode() for p in out.rglob("*.gz")}


def test_the_command_page_has_every_command_and_option_of_the_parser(pages) -> None:
    page = pages["ppmq.1.gz"]
    _, subparsers = _parser()
    for name, sub in subparsers.items():
        assert f'.SS "ppmq {name} ' in page
        for action in sub._actions:
            for option in action.option_strings:
                assert option.replace("-", "\\-") in page, (name, option)


def test_a_command_with_subcommands_shows_each_with_its_own_arguments(pages) -> None:
    page = pages["ppmq.1.gz"]
    assert '.SS "ppmq bridge to [\\-h] [\\-c CONFIG] [\\-s SOCKET] [\\-\\-subject\\-prefix PREFIX] NATS_URL SUBSCRIBER"' in page
    assert '.SS "ppmq bridge from [\\-h] [\\-c CONFIG] [\\-s SOCKET] NATS_URL STREAM CONSUMER TOPIC"' in page


def test_the_command_page_shows_take_with_its_options(pages) -> None:
    page = pages["ppmq.1.gz"]
    usage = (
        '.SS "ppmq take [\\-h] [\\-c CONFIG] [\\-s SOCKET] [\\-n N] [\\-\\-wait DURATION] [\\-\\-ack | \\-\\-no\\-ack] TOPIC SUBSCRIBER"'
    )
    assert usage in page
    assert "\\fB\\-\\-no\\-ack\\fR\ndo not ack: the messages go back to the queue when the command exits" in page


def test_the_command_page_shows_top_with_its_options_and_columns(pages) -> None:
    page = pages["ppmq.1.gz"]
    assert '.SS "ppmq top [\\-h] [\\-c CONFIG] [\\-s SOCKET] [\\-i DURATION] [\\-n N]"' in page
    assert "a live view of every topic and subscriber" in page
    assert "\\fB\\-n\\fR, \\fB\\-\\-count\\fR N\nprint N plain tables" in page
    assert "OLDEST: the age of the oldest ready message" in page


def test_the_command_page_names_the_completion_files(pages) -> None:
    assert "/usr/share/bash\\-completion/completions/ppmq" in pages["ppmq.1.gz"]


def test_the_config_page_documents_every_key_of_every_config_struct(pages) -> None:
    page = pages["ppmq.yaml.5.gz"]
    for _, prefix, struct in SECTIONS:
        for f in msgspec.structs.fields(struct):
            if f.encode_name not in ("Journal", "Metrics", "Subscribers", "Topics") or prefix:
                assert f"\\fB{f.encode_name}\\fR" in page, prefix + f.encode_name


def test_a_key_the_example_does_not_document_stops_the_pages() -> None:
    # Given the example without the comment above Window
    undocumented = EXAMPLE.replace("    # Extension. At most this many messages of one topic in flight\n", "").replace(
        "    # (delivered, not acknowledged) to this subscriber. Default BatchSize.\n", ""
    )
    assert "Subscribers.Window" not in documented_keys(undocumented)
    with pytest.raises(ManPageError, match=r"Subscribers\[\]\.Window"):
        config_page(undocumented)


def test_commented_out_keys_document_optional_keys() -> None:
    docs = documented_keys(EXAMPLE)
    assert docs["Subscribers.Users"].startswith("Extension. Who may ack or RECONNECT")
    assert docs["Journal.Host"].startswith("The host name written in every record")


@pytest.mark.skipif(not shutil.which("groff"), reason="groff is not installed")
@pytest.mark.parametrize("name", ["ppmq.1.gz", "ppmq.yaml.5.gz"])
def test_groff_renders_each_page_without_a_warning(pages, name) -> None:
    done = subprocess.run(["groff", "-man", "-ww", "-z"], input=pages[name], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")
