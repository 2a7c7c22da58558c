"""The .deb installed into this machine: its files where the units and the config
expect them, what postinst sets up, and the packaged broker serving messages as
the ppmq user, on a test config and on the packaged one. No systemd runs here:
systemd-analyze checks the units, and systemd-socket-activate hands the broker its
socket as ppmq.socket would."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import NotifyListener, wait_for
from tests.packaging.conftest import Machine, Packages, run
from tests.unit.test_packaging import paste
from tests.unit.test_packaging import unit_values as values_in

UNITS = Path("/usr/lib/systemd/system")
CONFIG = Path("/etc/ppmq/ppmq.yaml")
AS_PPMQ = ("setpriv", "--reuid=ppmq", "--regid=ppmq", "--init-groups")
EXAMPLES = Path("/usr/share/doc/ppmq/examples")
EXAMPLE_SUBSCRIBER = EXAMPLES / "subscriber" / "archive"


@pytest.fixture(scope="module")
def installed(machine: Machine, packages: Packages) -> Machine:
    machine.install(packages.deb)
    return machine


def unit_values(unit: str, key: str) -> list[str]:
    """Every value of KEY in an installed unit file (keys may repeat, as ExecReload=)."""
    return values_in(UNITS / unit, key)


def owner(path: Path) -> tuple[str, str, int]:
    st = path.stat()
    return pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name, stat.S_IMODE(st.st_mode)


def test_the_units_find_the_command_the_config_and_the_documentation(installed: Machine) -> None:
    for key in ("ExecStart", "ExecReload"):
        for command in unit_values("ppmq.service", key):
            words = command.split()
            assert os.access(words[0], os.X_OK), f"{key}={command}: {words[0]} is not executable"
            if "-c" in words:
                assert words[words.index("-c") + 1] == str(CONFIG)
    for unit in ("ppmq.service", "ppmq.socket", "ppmq-subscriber@.socket", "ppmq-subscriber@.service", "ppmq-bridge@.service"):
        (doc,) = unit_values(unit, "Documentation")
        assert Path(doc.removeprefix("file:")).is_file(), f"{unit}: Documentation={doc} is missing"
    assert Path("/usr/bin/ppmq").resolve() == Path("/opt/ppmq/bin/ppmq")
    # and what the README links to is beside it
    readme = Path("/usr/share/doc/ppmq/README.md")
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", readme.read_text()))
    assert linked and all((readme.parent / link).is_file() for link in linked), linked


def test_man_finds_the_command_and_the_config_pages(installed: Machine) -> None:
    for section, page, expected in (("1", "ppmq", "PPMQ_CONFIG"), ("5", "ppmq.yaml", "MaxAttempts")):
        done = subprocess.run(["man", "-P", "cat", section, page], capture_output=True, text=True, env={**os.environ, "MANWIDTH": "100"})
        assert done.returncode == 0 and expected in done.stdout, done.stderr


def test_bash_and_zsh_find_the_completion_of_ppmq(installed: Machine) -> None:
    """Where bash-completion and Debian's zsh look for a command's completion."""
    bash_file, zsh_file = Path("/usr/share/bash-completion/completions/ppmq"), Path("/usr/share/zsh/vendor-completions/_ppmq")
    assert zsh_file.read_text().startswith("#compdef ppmq\n")
    script = f"source {bash_file}; complete -p ppmq; COMP_WORDS=(ppmq to); COMP_CWORD=1; _ppmq; echo ${{COMPREPLY[*]}}"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert (done.returncode, done.stdout.splitlines()) == (0, ["complete -F _ppmq ppmq", "top"]), done.stderr


def test_the_packaged_config_uses_the_sockets_and_the_directory_of_the_units(installed: Machine) -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert unit_values("ppmq.socket", "ListenStream") == [config["ServerSocket"]]
    assert unit_values("ppmq.service", "StateDirectory") == ["ppmq"]
    assert config["DataPath"] == "/var/lib/ppmq"


def test_the_packaged_config_has_no_subscribers_and_the_examples_paste_into_it(installed: Machine, tmp_path: Path) -> None:
    """Nothing queues up for a subscriber that a real host does not have; each example
    the package ships, its items pasted into the lists of /etc/ppmq/ppmq.yaml, passes
    the packaged `ppmq check`, with the socket its socket unit listens on."""
    config = yaml.safe_load(CONFIG.read_text())
    assert (config["Subscribers"], config["Topics"]) == ([], [])
    (template,) = unit_values("ppmq-subscriber@.socket", "ListenStream")
    examples = sorted(EXAMPLES.glob("*/ppmq.yaml"))
    assert {e.parent.name for e in examples} >= {"subscriber", "parallel"}
    for example in examples:
        merged = tmp_path / f"{example.parent.name}.yaml"
        merged.write_text(paste(CONFIG.read_text(), example.read_text()))
        assert "ok" in run("/usr/bin/ppmq", "check", "-c", merged)
        for sub in yaml.safe_load(merged.read_text())["Subscribers"]:
            own = example.parent / f"ppmq-{sub['Name']}.socket"
            listens = values_in(own, "ListenStream") if own.exists() else [template.replace("%i", sub["Name"])]
            assert listens == [sub["Socket"]], example


def test_systemd_analyze_verify_finds_nothing_to_say_about_the_installed_units(installed: Machine) -> None:
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", UNITS / "ppmq.socket", UNITS / "ppmq.service"],
        capture_output=True,
        text=True,
    )
    # A misspelt key is only a warning with exit 0: any output is a finding.
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


def test_postinst_creates_the_user_the_directories_and_enables_the_units(installed: Machine) -> None:
    user = pwd.getpwnam("ppmq")
    assert (user.pw_dir, user.pw_shell) == ("/var/lib/ppmq", "/usr/sbin/nologin")
    assert owner(Path("/var/lib/ppmq")) == ("ppmq", "ppmq", 0o700)
    assert owner(Path("/run/ppmq")) == ("root", "root", 0o755)
    assert owner(Path("/run/ppmq/sub")) == ("root", "root", 0o755)
    # ppmq.socket does not start unless its SocketUser= and SocketGroup= exist.
    (socket_user,) = unit_values("ppmq.socket", "SocketUser")
    (socket_group,) = unit_values("ppmq.socket", "SocketGroup")
    pwd.getpwnam(socket_user)
    grp.getgrnam(socket_group)
    wants = Path("/etc/systemd/system")
    assert (wants / "sockets.target.wants/ppmq.socket").resolve().name == "ppmq.socket"
    assert (wants / "multi-user.target.wants/ppmq.service").resolve().name == "ppmq.service"


def test_the_package_ships_the_directory_of_the_subscriber_handlers(installed: Machine) -> None:
    """ppmq-subscriber@.service runs /etc/ppmq/subscribers/NAME, which the README
    installs there: the directory is the package's, owned by root."""
    (condition,) = unit_values("ppmq-subscriber@.service", "ConditionFileIsExecutable")
    handlers = Path(condition).parent
    assert owner(handlers) == ("root", "root", 0o755)
    assert str(handlers) in run("dpkg-query", "--listfiles", "ppmq").splitlines()


def test_ppmq_check_accepts_the_packaged_config(installed: Machine) -> None:
    assert "ok" in run("/usr/bin/ppmq", "check", "-c", CONFIG)


def test_the_packaged_bridge_finds_nats_py(installed: Machine) -> None:
    """ppmq-bridge@.service ships in the package: what it runs must be there too."""
    assert "usage" in run("/usr/bin/ppmq", "bridge", "--help").lower()
    run("/opt/ppmq/bin/python3", "-c", "import nats.js")


def test_python_finds_every_module_compiled_and_writes_nothing_under_opt(installed: Machine) -> None:
    """With ProtectSystem=strict /opt is read-only: the package must bring every .pyc."""
    run("/usr/bin/ppmq", "check", "-c", CONFIG)  # as root, so Python could write a missing .pyc
    packaged = set(run("dpkg-query", "--listfiles", "ppmq").splitlines())
    on_disk = {str(p) for p in Path("/opt/ppmq").rglob("*")}
    assert on_disk - packaged == set()
    sources = {p for p in packaged if p.endswith(".py")}
    assert len(sources) > 20
    for source in sources:
        stem = Path(source)
        assert any(p.startswith(f"{stem.parent}/__pycache__/{stem.stem}.cpython-") for p in packaged), source


@pytest.fixture
def ppmq_dir() -> Iterator[Path]:
    """A temp dir the ppmq user owns, with a short path for the sockets, and its
    `sub` directory, as tmpfiles.d makes /run/ppmq/sub (nothing binding a socket
    creates a directory)."""
    with tempfile.TemporaryDirectory(prefix="ppmq-deb-") as d:
        ppmq = pwd.getpwnam("ppmq")
        os.mkdir(Path(d) / "sub")
        for path in (d, Path(d) / "sub"):
            os.chown(path, ppmq.pw_uid, ppmq.pw_gid)
        yield Path(d)


def test_the_packaged_broker_serves_a_message_as_the_ppmq_user(installed: Machine, ppmq_dir: Path) -> None:
    sub_socket = ppmq_dir / "sub" / "printer.sock"
    config = ppmq_dir / "ppmq.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "ServerSocket": str(ppmq_dir / "ppmq.sock"),
                "DataPath": str(ppmq_dir / "data"),
                "RetryMax": "200ms",
                "Subscribers": [{"Name": "printer", "Socket": str(sub_socket)}],
                "Topics": [{"Name": "events", "Subscribers": ["printer"]}],
            }
        )
    )
    with open(ppmq_dir / "broker.log", "wb") as log, open(ppmq_dir / "batches", "wb") as batches:
        broker = subprocess.Popen([*AS_PPMQ, "/usr/bin/ppmq", "serve", "-c", config], stdout=log, stderr=subprocess.STDOUT)
        listener = subprocess.Popen([*AS_PPMQ, "/usr/bin/ppmq", "listen", sub_socket, "--ack"], stdout=batches, stderr=log)
        try:
            # Not the socket's path: it exists from bind() on, before the broker listens.
            wait_for(
                lambda: "serving on" in (ppmq_dir / "broker.log").read_text(),
                what=f"the broker; log:\n{(ppmq_dir / 'broker.log').read_text()}",
            )
            run(*AS_PPMQ, "/usr/bin/ppmq", "publish", "-c", config, "events", "hello")
            line = wait_for(lambda: (ppmq_dir / "batches").read_text(), what="a batch at the listener")
            assert [m["Payload"] for m in json.loads(line)["Messages"]] == ["hello"]
            wait_for(lambda: acked(config, "events", "printer") == 1, what="the ack")
            assert proc_uid(broker.pid) == pwd.getpwnam("ppmq").pw_uid
            assert owner(ppmq_dir / "data")[0] == "ppmq"
        finally:
            listener.kill()
            listener.wait()
            broker.send_signal(signal.SIGTERM)
            assert broker.wait(timeout=30) == 0, (ppmq_dir / "broker.log").read_text()


def test_the_service_command_serves_the_packaged_config_to_the_packaged_example_subscriber(installed: Machine, ppmq_dir: Path) -> None:
    """ppmq.service's ExecStart as systemd runs it: as ppmq, on the packaged config,
    with ppmq.socket's listening socket inherited and a NOTIFY_SOCKET. The example
    subscriber the package ships, added as the README's "Adding a subscriber" says
    (its ppmq.yaml pasted into /etc/ppmq/ppmq.yaml, its handler installed as
    /etc/ppmq/subscribers/archive), gets the batch on /run/ppmq/sub/archive.sock
    (handed to ppmq as SocketUser= and SocketMode= of ppmq-subscriber@.socket would)
    and acks it; the store lands in /var/lib/ppmq."""
    shipped = CONFIG.read_text()
    CONFIG.write_text(paste(shipped, (EXAMPLES / "subscriber" / "ppmq.yaml").read_text()))
    config = yaml.safe_load(CONFIG.read_text())
    (exec_start,) = unit_values("ppmq.service", "ExecStart")
    (fdname,) = unit_values("ppmq.socket", "FileDescriptorName")
    archive = Path(next(s["Socket"] for s in config["Subscribers"] if s["Name"] == "archive"))
    handler = Path("/etc/ppmq/subscribers/archive")
    run("install", "-m", "0755", EXAMPLE_SUBSCRIBER, handler)  # as the README's "Adding a subscriber" does
    notify = NotifyListener(ppmq_dir / "notify")
    os.chmod(notify.path, 0o666)
    with open(ppmq_dir / "broker.log", "wb") as log:
        activator = subprocess.Popen(
            [
                "systemd-socket-activate",
                "-l",
                config["ServerSocket"],
                f"--fdname={fdname}",
                f"--setenv=NOTIFY_SOCKET={notify.path}",
                *AS_PPMQ,
                *exec_start.split(),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: f"Listening on {config['ServerSocket']}" in (ppmq_dir / "broker.log").read_text(), what="the activator to listen")
        subscriber = subprocess.Popen(
            [handler, "--name", "archive", "-c", CONFIG],
            env={**os.environ, "STATE_DIRECTORY": str(ppmq_dir)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(archive.exists, what=f"{archive}")
            os.chown(archive, pwd.getpwnam("ppmq").pw_uid, pwd.getpwnam("ppmq").pw_gid)
            os.chmod(archive, 0o600)
            run("/usr/bin/ppmq", "publish", "-c", CONFIG, "audit", "hello")
            notify.wait("READY", "1")
            line = wait_for(
                lambda: (ppmq_dir / "messages.jsonl").exists() and (ppmq_dir / "messages.jsonl").read_text(),
                what=f"the example subscriber's messages.jsonl; log:\n{(ppmq_dir / 'broker.log').read_text()}",
            )
            message = json.loads(line)
            assert message.pop("Key")  # the broker's: the topic does not dedupe
            assert message == {"Topic": "audit", "Priority": 0, "Payload": "hello"}
            wait_for(lambda: acked(CONFIG, "audit", "archive") == 1, what="the ack")
            assert owner(Path("/var/lib/ppmq/data.mdb"))[0] == "ppmq"
            assert f"serving on {config['ServerSocket']} (from systemd)" in (ppmq_dir / "broker.log").read_text()
        finally:
            subscriber.terminate()
            subscriber.wait(timeout=30)
            activator.send_signal(signal.SIGTERM)  # the activator exec'd the broker: same pid
            assert activator.wait(timeout=30) == 0, (ppmq_dir / "broker.log").read_text()
            notify.close()
            for leftover in (Path(config["ServerSocket"]), archive, handler):
                leftover.unlink(missing_ok=True)
            CONFIG.write_text(shipped)


def acked(config: Path, topic: str, subscriber: str) -> int:
    status = json.loads(run("/usr/bin/ppmq", "status", "--json", "-c", config))
    return status["Topics"][topic]["Subscribers"][subscriber]["Acked"]


def proc_uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def test_reinstalling_keeps_an_edited_config(installed: Machine, packages: Packages) -> None:
    edited = CONFIG.read_text() + "# edited by the operator\n"
    CONFIG.write_text(edited)
    installed.install(packages.deb)
    assert CONFIG.read_text() == edited
    assert not Path(f"{CONFIG}.dpkg-dist").exists()


def test_the_build_prints_no_deprecation_and_the_package_names_its_licence(installed: Machine, packages: Packages) -> None:
    """The wheel is built from pyproject.toml, whose licence is an SPDX expression:
    setuptools deprecates the older table form with a banner at every build."""
    assert "deprecat" not in packages.build_log.lower(), packages.build_log
    (metadata,) = Path("/opt/ppmq/lib").glob("python3*/site-packages/ppmq-*.dist-info/METADATA")
    assert "License-Expression: MIT" in metadata.read_text().splitlines()
    assert "Permission is hereby granted" in (metadata.parent / "licenses/LICENSE").read_text()


def test_lintian_reports_no_errors_or_warnings(packages: Packages) -> None:
    """Every tag that is overridden says why in packaging/deb/lintian-overrides."""
    proc = subprocess.run(["lintian", "--fail-on", "error,warning", packages.deb], capture_output=True, text=True)
    findings = [line for line in proc.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert (proc.returncode, findings) == (0, [])
