"""Prometheus metrics (PROTOCOL §10): the Metrics textfile and `ppmq metrics`,
from a real broker, read back with prometheus_client's own parser."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ppmq.cli.main import main

from ..conftest import wait_for
from .test_access import as_user, users  # noqa: F401 - users is a fixture: throwaway accounts
from .test_cli import PPMQ, ppmq

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
TOPICS = [
    {"Name": "t", "Priorities": 2, "Subscribers": ["s", "idle"]},
    {"Name": "u", "Subscribers": ["s"]},
]
SECTION_10 = {
    "ppmq_published_messages": {"topic"},
    "ppmq_stored_messages": {"topic"},
    "ppmq_ready_messages": {"topic", "subscriber", "priority"},
    "ppmq_inflight_messages": {"topic", "subscriber"},
    "ppmq_delivered_messages": {"topic", "subscriber"},
    "ppmq_acked_messages": {"topic", "subscriber"},
    "ppmq_redelivered_messages": {"topic", "subscriber"},
    "ppmq_expired_messages": {"topic"},
    "ppmq_dead_lettered_messages": {"topic", "subscriber"},
    "ppmq_oldest_ready_age_seconds": {"topic", "subscriber"},
    "ppmq_subscriber_connected": {"subscriber"},
    "ppmq_rejected_requests": set(),
    "ppmq_commits": set(),
    "ppmq_store_used_bytes": set(),
}


def families(text: str) -> dict[str, dict[tuple, float]]:
    """Family name -> {sorted label items (with the sample's own name) -> value}."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {(s.name, *sorted(s.labels.items())): s.value for s in family.samples}
    return out


def value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    return fams[family][(sample or family, *sorted(labels.items()))]


def metrics_now(b) -> dict[str, dict[tuple, float]]:
    done = ppmq("metrics", "-c", b.config_path)
    assert done.returncode == 0, done.stderr
    return families(done.stdout)


def textfile(b) -> Path:
    return Path(b.config["Metrics"]["Textfile"])


def read_textfile(b) -> dict[str, dict[tuple, float]]:
    return families(textfile(b).read_text())


@pytest.fixture
def broker(broker_factory, short_tmp):
    return broker_factory(TOPICS, ["s", "idle"], Metrics={"Textfile": str(short_tmp / "ppmq.prom"), "Interval": "1h"})


def test_ppmq_metrics_has_every_family_of_section_10_with_its_labels(broker, broker_factory):
    # Given two messages, held unacked by a connected subscriber and waiting for one that is not
    sub = broker_factory.subscriber(broker, "s", ack=None)
    with broker.client() as c:
        c.publish("t", [{"Payload": "a", "Priority": 0}, {"Payload": "b", "Priority": 1}])
    sub.wait_messages(2)
    # When the metrics are asked for
    fams = metrics_now(broker)
    # Then every family of §10 is there, with exactly its labels
    for name, labels in SECTION_10.items():
        assert name in fams, name
        for sample in fams[name]:
            assert {k for k, _ in sample[1:]} == labels, (name, sample)
    # And they follow the broker's counters: priorities in decimal, ages 0 when nothing is ready
    assert value(fams, "ppmq_published_messages", "ppmq_published_messages_total", topic="t") == 2
    assert value(fams, "ppmq_stored_messages", topic="t") == 2
    assert value(fams, "ppmq_ready_messages", topic="t", subscriber="idle", priority="0") == 1
    assert value(fams, "ppmq_ready_messages", topic="t", subscriber="idle", priority="1") == 1
    assert value(fams, "ppmq_inflight_messages", topic="t", subscriber="s") == 2
    assert value(fams, "ppmq_delivered_messages", "ppmq_delivered_messages_total", topic="t", subscriber="s") == 2
    assert value(fams, "ppmq_oldest_ready_age_seconds", topic="u", subscriber="s") == 0
    assert value(fams, "ppmq_oldest_ready_age_seconds", topic="t", subscriber="idle") >= 0
    assert value(fams, "ppmq_subscriber_connected", subscriber="s") == 1
    assert value(fams, "ppmq_subscriber_connected", subscriber="idle") == 0
    assert value(fams, "ppmq_store_used_bytes") > 0


def test_commit_durations_are_a_histogram_of_every_step(broker):
    # Given a few commits
    with broker.client() as c:
        for i in range(3):
            c.publish("u", [{"Payload": str(i)}])
    # When the metrics are read
    fams = metrics_now(broker)
    # Then the histogram counts steps in cumulative buckets up to +Inf
    hist = fams["ppmq_commit_duration_seconds"]
    buckets = sorted((float(dict(k[1:])["le"]), v) for k, v in hist.items() if k[0].endswith("_bucket"))
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and buckets[-1][0] == float("inf")
    count = hist[("ppmq_commit_duration_seconds_count",)]
    assert count == counts[-1] >= 3
    assert hist[("ppmq_commit_duration_seconds_sum",)] > 0


def test_the_textfile_is_written_at_start_and_at_stop_with_the_same_families(broker):
    # Given the file the broker wrote as it started (Interval is an hour: no write between)
    wait_for(textfile(broker).exists, what="the textfile written at start")
    assert value(read_textfile(broker), "ppmq_published_messages", "ppmq_published_messages_total", topic="u") == 0
    # When messages are published and the broker stops
    with broker.client() as c:
        c.publish("u", [{"Payload": "x"}, {"Payload": "y"}])
    live = metrics_now(broker)
    assert broker.stop() == 0
    # Then the file holds the final counters, in the same families as `ppmq metrics`
    final = read_textfile(broker)
    assert value(final, "ppmq_published_messages", "ppmq_published_messages_total", topic="u") == 2
    assert set(final) == set(live)
    # And nothing else was left in its directory that node_exporter would read
    assert [p.name for p in textfile(broker).parent.glob("*.prom")] == ["ppmq.prom"]
    assert oct(textfile(broker).stat().st_mode & 0o777) == oct(0o644)


def test_the_textfile_is_rewritten_every_interval(broker_factory, short_tmp):
    # Given a broker writing its metrics every 100ms
    b = broker_factory(TOPICS, ["s", "idle"], Metrics={"Textfile": str(short_tmp / "ppmq.prom"), "Interval": "100ms"})
    # When a message is published
    with b.client() as c:
        c.publish("u", [{"Payload": "x"}])

    # Then a later write of the file shows it, without a restart
    def shows_it() -> bool:
        fams = read_textfile(b) if textfile(b).exists() else {}
        return bool(fams) and value(fams, "ppmq_published_messages", "ppmq_published_messages_total", topic="u") == 1

    wait_for(shows_it, what="the published message in the textfile")


def test_a_textfile_that_cannot_be_written_is_logged_once_and_the_broker_goes_on(broker_factory, short_tmp):
    # Given a broker writing its metrics every 100ms into a directory of their own
    folder = short_tmp / "metrics"
    folder.mkdir()
    b = broker_factory(TOPICS, ["s", "idle"], Metrics={"Textfile": str(folder / "ppmq.prom"), "Interval": "100ms"})
    wait_for((folder / "ppmq.prom").exists, what="the first textfile")
    # When the directory goes away, and comes back
    shutil.rmtree(folder)
    wait_for(lambda: "metrics: cannot write" in b.log, what=f"the write error in the log:\n{b.log}")
    with b.client() as c:
        c.publish("u", [{"Payload": "x"}])
    folder.mkdir()
    # Then the broker served on, wrote the file again, and said so once each way
    wait_for((folder / "ppmq.prom").exists, what="the textfile written again")
    wait_for(lambda: "metrics: writing" in b.log, what="the recovery in the log")
    assert b.log.count("metrics: cannot write") == 1
    assert b.alive()


def test_counters_survive_a_restart_as_statuss_do(broker):
    # Given published messages and a clean restart
    with broker.client() as c:
        c.publish("t", [{"Payload": "x"}] * 3)
    commits = value(metrics_now(broker), "ppmq_commits", "ppmq_commits_total")
    broker.stop()
    broker.start()
    # When the metrics are read from the new process
    fams = metrics_now(broker)
    # Then the counters went on from where they were
    assert value(fams, "ppmq_published_messages", "ppmq_published_messages_total", topic="t") == 3
    assert value(fams, "ppmq_commits", "ppmq_commits_total") > commits
    assert value(fams, "ppmq_ready_messages", topic="t", subscriber="idle", priority="0") == 3


def test_ppmq_metrics_without_a_running_broker_exits_1(broker_factory):
    b = broker_factory(TOPICS, ["s", "idle"], start=False)
    done = ppmq("metrics", "-c", b.config_path)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "ppmq metrics: cannot connect to" in done.stderr


def test_a_textfile_in_a_missing_directory_is_a_config_error_at_check_and_at_start(broker_factory, short_tmp):
    # Given a Metrics path whose directory does not exist
    missing = short_tmp / "nowhere" / "ppmq.prom"
    b = broker_factory(TOPICS, ["s", "idle"], start=False, Metrics={"Textfile": str(missing)})
    # When it is checked, and when the broker starts on it
    check = ppmq("check", "-c", b.config_path)
    serve = subprocess.run([*PPMQ, "serve", "-c", str(b.config_path)], capture_output=True, text=True, timeout=30)
    # Then both refuse it, naming the key and the directory, and the broker never listens
    for done in (check, serve):
        assert done.returncode == 1
        assert re.search(rf"ppmq\.yaml:\d+: Metrics\.Textfile: directory {short_tmp}/nowhere does not exist", done.stderr), done.stderr
    assert not os.path.exists(b.socket)


def _ppmq_in_process(*argv: str) -> dict:
    """In a child that became another user: the ppmq command, its exit status and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(list(argv))
    return {"status": status, "stderr": err.getvalue()}


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to a throwaway user needs root")
@pytest.mark.skipif(not shutil.which("useradd"), reason="useradd (package passwd) is not installed")
def test_a_textfile_in_a_directory_the_broker_cannot_write_is_a_config_error_at_check_and_at_start(broker_factory, short_tmp, users):  # noqa: F811 - the fixture
    # Given a Metrics directory that only root may write, and a config any user may read
    os.chmod(short_tmp, 0o755)
    (short_tmp / "metrics").mkdir(mode=0o755)
    b = broker_factory(TOPICS, ["s", "idle"], start=False, Metrics={"Textfile": str(short_tmp / "metrics" / "ppmq.prom")})
    # When another user checks it, and starts a broker on it
    results = [as_user(users.bob, _ppmq_in_process, command, "-c", str(b.config_path))() for command in ("check", "serve")]
    # Then both refuse it, naming the key, the directory and the user
    for done in results:
        assert done["status"] == 1
        expected = rf"ppmq\.yaml:\d+: Metrics\.Textfile: directory {short_tmp}/metrics is not writable by uid {users.bob.uid}"
        assert re.search(expected, done["stderr"]), done["stderr"]
    assert not os.path.exists(b.socket)


def test_the_example_rules_are_prometheus_alerting_rules_over_families_the_broker_writes(broker):
    # Given the rules and the dashboard of examples/monitoring
    rules = yaml.safe_load((EXAMPLES / "ppmq.rules.yml").read_text())
    dashboard = json.loads((EXAMPLES / "ppmq.grafana.json").read_text())
    # Then the rules file has Prometheus's shape: groups of named alerts, each with an expression, a severity and a summary
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert all(group["name"] for group in rules["groups"])
    assert {"PpmqOldestReadyMessageOld", "PpmqDeadLetters", "PpmqSubscriberDisconnected", "PpmqStoreNearlyFull", "PpmqSlowCommits"} <= {
        a["alert"] for a in alerts
    }
    for alert in alerts:
        assert set(alert) <= {"alert", "expr", "for", "labels", "annotations"}, alert["alert"]
        assert alert["expr"].strip() and alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"]
    # And every ppmq series that they and the dashboard name is one the broker writes
    exprs = [a["expr"] for a in alerts] + [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in re.findall(r"\bppmq_[a-z_]+", e)}
    written = {s[0] for fam in metrics_now(broker).values() for s in fam}
    assert named <= written, named - written


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (Debian package prometheus) is not installed")
def test_promtool_accepts_the_example_rules_and_their_unit_tests_pass():
    for args in (["check", "rules", "ppmq.rules.yml"], ["test", "rules", "ppmq.rules.test.yml"]):
        done = subprocess.run(["promtool", *args], cwd=EXAMPLES, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
