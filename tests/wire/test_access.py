"""Access control by peer credentials (docs/security.md), with real users.

Each test run creates throwaway users and a group (removed afterwards, also on
failure), and talks to a real broker from child processes that switch to those
users: the broker reads SO_PEERCRED, exactly as it would for any local process.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest

from ppmq.errors import ClientError
from tests.conftest import Subscriber, wait_for

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="creating users and switching to them needs root"),
    pytest.mark.skipif(not shutil.which("useradd"), reason="useradd and groupadd (package passwd) are not installed"),
]

TIMEOUT_S = 15.0


class User(NamedTuple):
    name: str
    uid: int
    gid: int


class Users(NamedTuple):
    alice: User  # member of `group`
    bob: User  # not a member
    group: str


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    tag = uuid.uuid4().hex[:6]
    group, made_users, made_group = f"ppmqg{tag}", [], False
    try:
        subprocess.run(["groupadd", group], check=True)
        made_group = True
        for name, extra in ((f"ppmqa{tag}", ["-G", group]), (f"ppmqb{tag}", [])):
            subprocess.run(["useradd", "-M", "-U", "-s", "/usr/sbin/nologin", *extra, name], check=True)
            made_users.append(name)
        alice, bob = (pwd.getpwnam(n) for n in made_users)
        yield Users(User(alice.pw_name, alice.pw_uid, alice.pw_gid), User(bob.pw_name, bob.pw_uid, bob.pw_gid), group)
    finally:
        for name in made_users:
            subprocess.run(["userdel", name], check=False)
        if made_group:
            subprocess.run(["groupdel", group], check=False)


def as_user(user: User, fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    """Run fn(*args) in a forked child that has become `user`; return a function
    that waits for the child and gives fn's JSON-able result (or raises its error)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(r)
        try:
            os.setgroups(os.getgrouplist(user.name, user.gid))
            os.setgid(user.gid)
            os.setuid(user.uid)
            out = {"ok": fn(*args)}
        except BaseException as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)

    def result() -> Any:
        with os.fdopen(r, "rb") as f:
            data = f.read()
        os.waitpid(pid, 0)
        out = json.loads(data)
        if "error" in out:
            raise OSError(out["error"])
        return out["ok"]

    return result


def _ask(path: str, wrappers: list[dict]) -> list[dict]:
    """In the child: send each wrapper (each with an Id), return the replies."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT_S)
    s.connect(path)
    s.sendall(b"".join(json.dumps(w).encode() + b"\n" for w in wrappers))
    f = s.makefile("rb")
    replies = [json.loads(f.readline()) for _ in wrappers]
    s.close()
    return replies


def numbered(wrappers: tuple[dict, ...]) -> list[dict]:
    """Each wrapper with an Id, so that every one is answered."""
    return [dict(w, Id=i) for i, w in enumerate(wrappers)]


def ask(user: User, path: str, *wrappers: dict) -> list[dict]:
    return as_user(user, _ask, path, numbered(wrappers))()


def ask_as_root(path: str, *wrappers: dict) -> list[dict]:
    """As the test itself runs: root, which is also the broker's own user here."""
    return _ask(path, numbered(wrappers))


def statuses(replies: list[dict]) -> list[int]:
    return [r["Status"] for r in replies]


def _listen(path: str, seconds: float) -> list[str]:
    """In the child: listen at path for a while; return the lines received."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    srv.settimeout(seconds)
    try:
        conn, _ = srv.accept()
    except TimeoutError:
        return []
    finally:
        srv.close()
        os.unlink(path)
    conn.settimeout(seconds)
    line = conn.makefile("rb").readline()
    conn.close()
    return [line.decode()] if line else []


def publish(topic: str, payload: str = "secret payload") -> dict:
    return {"Topic": topic, "Messages": [{"Payload": payload}]}


@pytest.fixture
def open_tmp(short_tmp):
    """Other users must reach the sockets in the test's directory."""
    os.chmod(short_tmp, 0o755)
    (short_tmp / "sub").mkdir(exist_ok=True)
    os.chmod(short_tmp / "sub", 0o1777)
    return short_tmp


# --- the socket and the store ---------------------------------------------------------------


def test_by_default_the_socket_is_0660_for_the_brokers_group_and_the_store_0700_so_others_cannot_connect(broker_factory, open_tmp, users):
    b = broker_factory([{"Name": "t"}])
    st = os.stat(b.socket)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, os.getegid())
    assert stat.S_IMODE(os.stat(open_tmp / "data").st_mode) == 0o700
    with pytest.raises(OSError, match="PermissionError"):
        ask(users.bob, b.socket, {"Command": "STATUS"})


def test_socket_mode_and_group_from_the_config_let_the_groups_members_in(broker_factory, open_tmp, users):
    b = broker_factory([{"Name": "t"}], SocketMode="0660", SocketGroup=users.group)
    st = os.stat(b.socket)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, grp.getgrnam(users.group).gr_gid)
    assert ask(users.alice, b.socket, {"Command": "STATUS"})[0]["Status"] == 200
    with pytest.raises(OSError, match="PermissionError"):
        ask(users.bob, b.socket, {"Command": "STATUS"})


def test_an_unknown_socket_group_stops_the_broker_with_a_clear_error(broker_factory, open_tmp):
    b = broker_factory([{"Name": "t"}], SocketGroup="no-such-group-ppmq", start=False)
    with pytest.raises(AssertionError, match="SocketGroup: no group 'no-such-group-ppmq'"):
        b.start()


# --- who may publish, ack, RECONNECT and ask STATUS -----------------------------------------


def test_without_access_keys_anyone_who_can_open_the_socket_may_do_anything(broker_factory, open_tmp, users):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"], SocketMode="0666")
    replies = ask(users.bob, b.socket, publish("t"), {"Subscriber": "s", "Command": "RECONNECT"}, {"Command": "STATUS"})
    assert [r["Status"] for r in replies] == [200, 200, 200]


def test_publishers_admit_named_users_groups_and_uids_and_refuse_others_with_403_logged_once(broker_factory, open_tmp, users):
    topics = [
        {"Name": "by-name", "Publishers": [users.alice.name]},
        {"Name": "by-group", "Publishers": [f"@{users.group}"]},
        {"Name": "by-uid", "Publishers": [users.bob.uid]},
        {"Name": "open"},
    ]
    b = broker_factory(topics, SocketMode="0666")
    alice = ask(users.alice, b.socket, *(publish(t["Name"]) for t in topics))
    bob = ask(users.bob, b.socket, *(publish(t["Name"]) for t in topics), publish("by-name"))
    assert [r["Status"] for r in alice] == [200, 200, 403, 200]
    assert [r["Status"] for r in bob] == [403, 403, 200, 200, 403]
    assert bob[0]["Error"] == f"Messages: uid {users.bob.uid} may not publish to topic 'by-name' (Publishers)"
    assert all("secret" not in r.get("Error", "") for r in alice + bob)
    status = b.status()
    assert status["Forbidden"] == 4 and status["Rejected"] == 4
    assert {t: status["Topics"][t]["Published"] for t in status["Topics"]} == {"by-name": 1, "by-group": 1, "by-uid": 1, "open": 2}
    # One log line per refused peer process, however often it was refused
    assert b.log.count(f"refused (403) to user {users.bob.name}") == 1
    assert b.log.count(f"refused (403) to user {users.alice.name}") == 1


@pytest.mark.parametrize("allow_root", [True, False])
def test_root_passes_every_rule_unless_allow_root_is_false(broker_factory, open_tmp, users, allow_root):
    b = broker_factory([{"Name": "t", "Publishers": [users.alice.name]}], SocketMode="0666", AllowRoot=allow_root)
    with b.client() as c:
        if allow_root:
            assert c.publish("t", [{"Payload": 1}]).accepted == 1
        else:
            with pytest.raises(ClientError, match="403: Messages: uid 0 may not publish"):
                c.publish("t", [{"Payload": 1}])


def test_subscriber_users_decide_who_may_ack_or_reconnect_as_it(broker_factory, open_tmp, users):
    b = broker_factory(
        [{"Name": "t", "Subscribers": ["s"]}], [{"Name": "s", "Users": [users.alice.name], "CheckOwner": False}], SocketMode="0666"
    )
    ack = {"Topic": "t", "Subscriber": "s", "Acks": ["1"]}
    reconnect = {"Subscriber": "s", "Command": "RECONNECT"}
    assert [r["Status"] for r in ask(users.alice, b.socket, ack, reconnect)] == [200, 200]
    refused = ask(users.bob, b.socket, ack, reconnect)
    assert [r["Status"] for r in refused] == [403, 403]
    assert refused[0]["Error"] == f"Acks: uid {users.bob.uid} may not act as subscriber 's' (Users)"
    assert refused[1]["Error"] == f"Command: uid {users.bob.uid} may not act as subscriber 's' (Users)"
    assert b.status()["Forbidden"] == 2


def test_status_users_limit_who_may_ask_status(broker_factory, open_tmp, users):
    b = broker_factory([{"Name": "t"}], SocketMode="0666", StatusUsers=[f"@{users.group}"])
    assert ask(users.alice, b.socket, {"Command": "STATUS"})[0]["Status"] == 200
    refused = ask(users.bob, b.socket, {"Command": "STATUS"})[0]
    assert (refused["Status"], refused["Error"]) == (403, f"Command: uid {users.bob.uid} may not ask STATUS (StatusUsers)")
    assert "Body" not in refused


def test_nacks_rejects_and_touch_follow_the_subscribers_users_as_acks_do(broker_factory, open_tmp, users):
    # Given a message in flight to s, whose Users is alice
    b = broker_factory(
        [{"Name": "t", "Subscribers": ["s"]}], [{"Name": "s", "Users": [users.alice.name], "CheckOwner": False}], SocketMode="0666"
    )
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": "m"}])
    (key,) = [m["Key"] for m in sub.wait_messages(1)]
    gives = [{"Topic": "t", "Subscriber": "s", field: [key]} for field in ("Touch", "Nacks", "Rejects")]
    # When bob touches, nacks and rejects it as s
    refused = ask(users.bob, b.socket, *gives)
    # Then each is refused, naming its key, and the message stays in flight, not even counted as ignored
    assert statuses(refused) == [403, 403, 403]
    assert [r["Error"] for r in refused] == [
        f"{f}: uid {users.bob.uid} may not act as subscriber 's' (Users)" for f in ("Touch", "Nacks", "Rejects")
    ]
    assert {k: b.sub_status("t", "s")[k] for k in ("InFlight", "IgnoredAcks")} == {"InFlight": 1, "IgnoredAcks": 0}
    assert b.status()["Forbidden"] == 3
    # And alice, one of s's Users, may: her nack has it delivered again, her reject drops it
    touch, nack, reject = gives
    assert statuses(ask(users.alice, b.socket, touch, nack)) == [200, 200]
    assert [m["Key"] for m in sub.wait_messages(2)] == [key, key]
    assert statuses(ask(users.alice, b.socket, reject)) == [200]
    assert b.status()["Topics"]["t"]["Stored"] == 0


def with_dead_letter(*subscribers: str) -> list[dict]:
    """Topic t of `subscribers`, whose DeadLetter is topic dead: REDRIVE's topic."""
    return [{"Name": "t", "Subscribers": list(subscribers), "DeadLetter": "dead"}, {"Name": "dead"}]


# PROTOCOL §8 Access: the commands that need AdminUsers, on with_dead_letter's topics and subscriber s
OPERATOR_COMMANDS = (
    {"Command": "PEEK", "Topic": "t"},
    {"Command": "PAUSE", "Subscriber": "s"},
    {"Command": "RESUME", "Subscriber": "s"},
    {"Command": "REDRIVE", "Topic": "dead"},
    {"Command": "PURGE", "Topic": "t"},
)


def test_operator_commands_need_admin_users_and_status_users_are_not_enough(broker_factory, open_tmp, users):
    # Given a message waiting for s, STATUS open to alice and bob, the operator commands to alice's group
    b = broker_factory(
        with_dead_letter("s"),
        ["s"],
        SocketMode="0666",
        StatusUsers=[users.alice.name, users.bob.name],
        AdminUsers=[f"@{users.group}", "nobody-ppmq"],
    )
    with b.client() as c:
        c.publish("t", [{"Payload": "secret payload"}])
    # When bob, who may ask STATUS, sends each operator command
    refused = ask(users.bob, b.socket, *OPERATOR_COMMANDS, {"Command": "STATUS"})
    # Then each is refused, shows no payload, and is logged once and counted
    assert statuses(refused) == [403, 403, 403, 403, 403, 200]
    assert [r["Error"] for r in refused[:-1]] == [
        f"Command: uid {users.bob.uid} may not send {w['Command']} (AdminUsers)" for w in OPERATOR_COMMANDS
    ]
    assert all("Body" not in r and "secret" not in r["Error"] for r in refused[:-1])
    assert b.status()["Forbidden"] == 5
    assert b.log.count(f"refused (403) to user {users.bob.name}") == 1
    assert "AdminUsers: no user or group 'nobody-ppmq' on this host; it matches nobody" in b.log
    # And nothing happened: the message was not purged, s is not paused
    assert (b.status()["Topics"]["t"]["Stored"], b.sub_status("t", "s")["Paused"]) == (1, False)
    # And alice, in the group, may send every one of them
    peek, *_, redrive, purge = allowed = ask(users.alice, b.socket, *OPERATOR_COMMANDS)
    assert statuses(allowed) == [200] * len(OPERATOR_COMMANDS)
    assert [m["Payload"] for m in peek["Body"]["Messages"]] == ["secret payload"]
    assert (redrive["Body"], purge["Body"]) == ({"Redriven": 0, "Skipped": 0}, {"Purged": 1})


@pytest.mark.parametrize(
    ("admin_list", "allow_root", "root_refused"),
    [(True, True, False), (True, False, True), (False, False, False)],
    ids=["list-root-allowed", "list-root-refused", "default-root-is-the-brokers-user"],
)
def test_admin_users_admit_root_unless_allow_root_is_false_and_by_default_the_brokers_own_user(
    broker_factory,
    open_tmp,
    users,
    admin_list,
    allow_root,
    root_refused,
):
    admins = {"AdminUsers": [users.alice.name]} if admin_list else {}
    b = broker_factory(with_dead_letter("s"), ["s"], AllowRoot=allow_root, **admins)
    replies = ask_as_root(b.socket, *OPERATOR_COMMANDS)
    assert statuses(replies) == [403 if root_refused else 200] * len(OPERATOR_COMMANDS)


def test_by_default_nobody_but_root_and_the_brokers_own_user_may_send_operator_commands(broker_factory, open_tmp, users):
    b = broker_factory(with_dead_letter("s"), ["s"], SocketMode="0666")
    assert statuses(ask(users.alice, b.socket, *OPERATOR_COMMANDS)) == [403] * len(OPERATOR_COMMANDS)


def test_ping_is_anyones_and_status_of_one_topic_keeps_the_status_users_rule(broker_factory, open_tmp, users):
    # Given STATUS and the operator commands for alice only
    b = broker_factory([{"Name": "t"}], SocketMode="0666", StatusUsers=[users.alice.name], AdminUsers=[users.alice.name])
    # When bob sends PING, and STATUS of one topic
    ping, status = ask(users.bob, b.socket, {"Command": "PING"}, {"Command": "STATUS", "Topic": "t"})
    # Then PING is answered and STATUS is refused
    assert (ping["Status"], sorted(ping["Body"])) == (200, ["UptimeSeconds", "Version"])
    assert (status["Status"], status["Error"]) == (403, f"Command: uid {users.bob.uid} may not ask STATUS (StatusUsers)")
    (allowed,) = ask(users.alice, b.socket, {"Command": "STATUS", "Topic": "t"})
    assert (allowed["Status"], list(allowed["Body"]["Topics"])) == (200, ["t"])


def test_acks_on_a_subscribers_own_delivery_connection_are_its_own_whoever_runs_it(broker_factory, open_tmp, users):
    # Given a subscriber whose Users does not name root, run by root with the owner check off
    b = broker_factory(
        [{"Name": "t", "Subscribers": ["s"]}], [{"Name": "s", "Users": [users.alice.name], "CheckOwner": False}], AllowRoot=False
    )
    sub = Subscriber(b.sub_socket("s"), ack="connection")
    try:
        with b.client() as c:
            with pytest.raises(ClientError, match="403: Acks"):  # through ServerSocket root is refused
                c.ack("t", "s", ["1"])
            c.publish("t", [{"Payload": "m"}])
        sub.wait_messages(1)
        wait_for(lambda: b.sub_status("t", "s")["Acked"] == 1, what="the ack on the delivery connection")
    finally:
        sub.close()


# --- the owner of a subscriber's socket -------------------------------------------------------


def test_a_subscriber_socket_owned_by_another_user_is_refused_until_its_own_user_listens(broker_factory, open_tmp, users):
    b = broker_factory(
        [{"Name": "t", "Subscribers": ["s"]}],
        [{"Name": "s", "Users": [users.alice.name]}],
        RetryMax="300ms",
    )
    with b.client() as c:
        c.publish("t", [{"Payload": "for alice only"}])
    squatter = as_user(users.bob, _listen, b.sub_socket("s"), 3.0)
    assert squatter() == []  # bob's socket never got a connection
    assert b.log.count("not root or one of the subscriber's Users (CheckOwner)") == 1
    owner = as_user(users.alice, _listen, b.sub_socket("s"), TIMEOUT_S)
    (line,) = owner()
    assert json.loads(line)["Messages"][0]["Payload"] == "for alice only"


def test_a_reload_applies_new_access_rules_to_connections_already_open(broker_factory, open_tmp):
    b = broker_factory([{"Name": "t", "Publishers": ["nobody-ppmq"]}], AllowRoot=False)
    with b.client() as c:
        with pytest.raises(ClientError, match="403: Messages: uid 0 may not publish"):
            c.publish("t", [{"Payload": 1}])
        b.reload(dict(b.config, AllowRoot=True))
        wait_for(lambda: "config reloaded" in b.log, what="the reload")
        assert c.publish("t", [{"Payload": 2}]).accepted == 1
    assert "no user or group 'nobody-ppmq' on this host; it matches nobody" in b.log


# --- what a delivery connection may carry ------------------------------------------------------


class DeliveryEnd:
    """The subscriber's end of its delivery connection, listening as root, as
    systemd's socket units do: requests sent back on it are answered on it."""

    def __init__(self, path: str) -> None:
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(1)
        self.srv.settimeout(TIMEOUT_S)
        self.conn: socket.socket | None = None
        self.batches: list[dict] = []  # pushed while a reply was awaited

    def accept(self) -> dict:
        """The first batch the broker pushes."""
        self.conn, _ = self.srv.accept()
        self.conn.settimeout(TIMEOUT_S)
        self.file = self.conn.makefile("rb")
        return json.loads(self.file.readline())

    def ask(self, *wrappers: dict) -> list[dict]:
        """The replies; batches pushed meanwhile are kept for next_batch."""
        self.conn.sendall(b"".join(json.dumps(w).encode() + b"\n" for w in numbered(wrappers)))
        replies = []
        while len(replies) < len(wrappers):
            line = json.loads(self.file.readline())
            (replies if "Status" in line else self.batches).append(line)
        return replies

    def next_batch(self) -> dict:
        return self.batches.pop(0) if self.batches else json.loads(self.file.readline())

    def close(self) -> None:
        for s in (self.conn, self.srv):
            if s is not None:
                s.close()


def test_a_delivery_connection_carries_only_its_own_subscribers_acks_and_reconnect(broker_factory, open_tmp, users):
    # Given a topic only alice may publish to, STATUS for alice only, and subscribers s and r,
    # with s's socket listened on by root (as systemd's socket units listen)
    b = broker_factory(
        [{"Name": "t", "Subscribers": ["s", "r"]}, {"Name": "closed", "Publishers": [users.alice.name]}],
        ["s", "r"],
        StatusUsers=[users.alice.name],
    )
    end = DeliveryEnd(b.sub_socket("s"))
    try:
        with b.client() as c:
            c.publish("t", [{"Payload": "m"}])
        (message,) = end.accept()["Messages"]
        # When the connection's other end asks for more than its own subscriber's acks
        replies = end.ask(
            publish("closed"),
            {"Command": "STATUS"},
            {"Topic": "t", "Subscriber": "r", "Acks": [message["Key"]]},
            {"Subscriber": "r", "Command": "RECONNECT"},
            {"Topic": "t", "Subscriber": "s", "Acks": [message["Key"]]},
            {"Subscriber": "s", "Command": "RECONNECT"},
        )
        # Then everything but s's own ack and RECONNECT is refused, and nothing of it happened
        assert [r["Status"] for r in replies] == [403, 403, 403, 403, 200, 200]
        assert (
            replies[0]["Error"]
            == "Messages: the delivery connection of subscriber 's' carries only its Acks, Nacks, Rejects, Touch and RECONNECT"
        )
        assert replies[2]["Error"].startswith("Subscriber: the delivery connection of subscriber 's'")
        status = b.status()
        assert status["Topics"]["closed"]["Published"] == 0
        assert status["Topics"]["t"]["Subscribers"]["r"]["Acked"] == 0
        assert status["Topics"]["t"]["Subscribers"]["s"]["Acked"] == 1
        assert status["Forbidden"] == 4
    finally:
        end.close()


def test_a_delivery_connection_carries_its_own_subscribers_nacks_rejects_and_touch_and_no_operator_command(broker_factory, open_tmp, users):
    # Given subscribers s and r, s's Users not naming root, and s's socket listened on by root
    b = broker_factory(
        with_dead_letter("s", "r"),
        [{"Name": "s", "Users": [users.alice.name], "CheckOwner": False}, "r"],
        AllowRoot=False,
    )
    end = DeliveryEnd(b.sub_socket("s"))
    try:
        with b.client() as c:
            c.publish("t", [{"Payload": "m"}])
        (message,) = end.accept()["Messages"]
        gives = [{"Topic": "t", field: [message["Key"]]} for field in ("Touch", "Nacks", "Rejects")]
        # When the connection's other end gives keys back as r, sends PING and the operator commands
        refused = end.ask(*(dict(g, Subscriber="r") for g in gives), {"Command": "PING"}, *OPERATOR_COMMANDS)
        # Then all is refused, and r's copy is untouched
        assert statuses(refused) == [403] * (4 + len(OPERATOR_COMMANDS))
        assert (
            refused[0]["Error"]
            == "Subscriber: the delivery connection of subscriber 's' carries only its Acks, Nacks, Rejects, Touch and RECONNECT"
        )
        assert refused[3]["Error"].startswith("Command: the delivery connection of subscriber 's'")
        assert b.sub_status("t", "r")["IgnoredAcks"] == 0
        assert b.status()["Forbidden"] == 4 + len(OPERATOR_COMMANDS)
        # And its own subscriber's are accepted, as s's, though root is not one of s's Users:
        # the nack has it pushed again, the reject dead-letters s's copy
        touch, nack, reject = (dict(g, Subscriber="s") for g in gives)
        assert statuses(end.ask(touch, nack)) == [200, 200]
        assert [m["Key"] for m in end.next_batch()["Messages"]] == [message["Key"]]
        assert statuses(end.ask(reject)) == [200]
        assert {k: b.sub_status("t", "s")[k] for k in ("InFlight", "DeadLettered")} == {"InFlight": 0, "DeadLettered": 1}
    finally:
        end.close()


# --- a reload between a request's arrival and its step ----------------------------------------------


PIPELINED = 200


def _flood(path: str, topic: str, seconds: float) -> dict[str, int]:
    """In the child: pipeline publishes to `topic` for a while; count the replies by status."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT_S)
    s.connect(path)
    f = s.makefile("rb")
    counts: dict[str, int] = {}
    sent = 0
    frame = json.dumps(publish(topic)).encode()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        s.sendall(b"".join(frame[:-1] + b',"Id":%d}\n' % (sent + i) for i in range(PIPELINED)))
        sent += PIPELINED
        for _ in range(PIPELINED):
            status = str(json.loads(f.readline())["Status"])
            counts[status] = counts.get(status, 0) + 1
    s.close()
    return counts


def test_requests_are_judged_by_the_access_rules_of_the_config_they_are_applied_under(broker_factory, open_tmp, users):
    # Given bob publishing to topic `new` as fast as he can on three connections, before it exists
    b = broker_factory([{"Name": "t"}], SocketMode="0666")
    floods = [as_user(users.bob, _flood, b.socket, "new", 4.0) for _ in range(3)]
    time.sleep(1.0)
    # When a reload creates `new`, for alice only
    b.reload(dict(b.config, Topics=[{"Name": "t"}, {"Name": "new", "Publishers": [users.alice.name]}]))
    counts: dict[str, int] = {}
    for flood in floods:
        for status, n in flood().items():
            counts[status] = counts.get(status, 0) + n
    # Then bob's publishes were refused before (404) and after (403) the reload, and none was stored
    assert "config reloaded" in b.log
    assert counts.get("404", 0) > 0 and counts.get("403", 0) > 0, counts
    assert counts.get("200", 0) == 0, counts
    assert b.status()["Topics"]["new"]["Stored"] == 0
