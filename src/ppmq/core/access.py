"""Who may do what: peer credentials against the config's access rules.

Every connection's credentials (SO_PEERCRED: uid, gid, pid) are read once, when
it is accepted, and never change for its lifetime. A topic's `Publishers`, a
subscriber's `Users` and the top-level `StatusUsers` and `AdminUsers` name user
names, `@group` names or numeric uids; they are resolved when the config is
taken (at start and at every reload), so a request costs a set lookup. A rule
that is not configured lets everyone through, as ppMQ did (anyone who can open
the socket), except `AdminUsers` (PROTOCOL §8), whose commands are new and
whose PEEK shows payloads: its default is root and the broker's own user. Root
passes every rule unless `AllowRoot: false`. A subscriber's own delivery
connection carries its acks (`Acks`, `Nacks`, `Rejects`, `Touch`) and RECONNECT,
which are that subscriber's by construction, and nothing else: the peer there is
whoever listens on the socket (PID 1, root, for systemd's socket units).

Before the broker connects to a subscriber's socket, the socket's owner (and,
once connected, the listening peer) must be root, the broker's own user, or a
user of the subscriber's `Users`, so that another local user cannot squat the
path and receive its messages.
"""

from __future__ import annotations

import functools
import grp
import logging
import os
import pwd
from collections.abc import Callable
from functools import partial

from ppmq.config import Config, SubscriberConfig
from ppmq.errors import Forbidden
from ppmq.protocol import messages as p

log = logging.getLogger("ppmq.access")

MAX_LOGGED_PEERS = 4096  # refusals are logged once per peer; past this many the memory starts over


class Peer:
    """The process at the other end of a Unix socket, as the kernel vouches for it.

    Its groups are looked up in the user database only when a rule names a
    group: a lookup may block (NSS, LDAP), and most connections never need one.
    """

    def __init__(self, uid: int, gid: int, pid: int) -> None:
        self.uid = uid
        self.gid = gid
        self.pid = pid  # 0 when unknown (a file's owner)

    @classmethod
    def of_uid(cls, uid: int) -> Peer:
        """The user `uid`, with its primary group from the user database."""
        try:
            return cls(uid, pwd.getpwuid(uid).pw_gid, 0)
        except KeyError:
            return cls(uid, -1, 0)

    @functools.cached_property
    def gids(self) -> frozenset[int]:
        """Its primary group and its user's supplementary groups (SO_PEERCRED gives
        only the first; the others are what `id USER` prints)."""
        try:
            return frozenset(os.getgrouplist(pwd.getpwuid(self.uid).pw_name, self.gid)) | {self.gid}
        except KeyError:
            return frozenset({self.gid})

    def __str__(self) -> str:
        return f"uid {self.uid}" + (f" pid {self.pid}" if self.pid else "")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "no such user"


class Rule:
    """One list of user names, `@group` names and uids, resolved to numbers."""

    def __init__(self, entries: list[str | int], allow_root: bool) -> None:
        self.allow_root = allow_root
        self.uids: set[int] = set()
        self.gids: set[int] = set()
        self.unknown: list[str] = []
        for entry in entries:
            self._add(str(entry).strip())

    def _add(self, entry: str) -> None:
        try:
            if entry.startswith("@"):
                name = entry[1:]
                self.gids.add(int(name) if name.isdigit() else grp.getgrnam(name).gr_gid)
            else:
                self.uids.add(int(entry) if entry.isdigit() else pwd.getpwnam(entry).pw_uid)
        except KeyError:
            self.unknown.append(entry)  # matches nobody: a typo denies, it never allows

    def allows(self, peer: Peer) -> bool:
        return (self.allow_root and peer.uid == 0) or peer.uid in self.uids or bool(self.gids and not self.gids.isdisjoint(peer.gids))


class Rules:
    """Every access rule of one config, resolved to numbers."""

    def __init__(self, config: Config) -> None:
        root = config.allow_root
        self.publishers = {t.name: Rule(t.publishers, root) for t in config.topics if t.publishers is not None}
        self.users = {s.name: Rule(s.users, root) for s in config.subscribers if s.users is not None}
        self.status = Rule(config.status_users, root) if config.status_users is not None else None
        self.admin = Rule(config.admin_users, root) if config.admin_users is not None else _with_broker(Rule([], root))
        # The socket's owner: root (systemd's sockets), the broker itself, or a user of Users.
        self.owners = {s.name: _owner_rule(s) for s in config.subscribers if s.owner_checked}

    def warn_unknown(self) -> None:
        """Log every entry that names no user or group here: it matches nobody."""
        named = [(f"topic {t} Publishers", r) for t, r in self.publishers.items()]
        named += [(f"subscriber {s} Users", r) for s, r in self.users.items()]
        named += [("StatusUsers", self.status)] if self.status else []
        named += [("AdminUsers", self.admin)]
        for what, rule in named:
            for entry in rule.unknown:
                log.warning("%s: no user or group %r on this host; it matches nobody", what, entry)


class Policy:
    """The access rules in force, and the log of refusals.

    The rules are one value, `rules`, replaced whole: the broker switches them in
    the transaction that switches its config (and back if that commit fails), and
    checks each request when it applies it, so a request is always judged by the
    rules of the config it is applied under.
    """

    def __init__(self) -> None:
        self._logged: set[tuple[int, int]] = set()
        self.rules: Rules | None = None  # None: no config yet, nothing is refused

    def guard(self, peer: Peer, where: str, own: str | None = None) -> Callable[[p.Request], None]:
        """The check for every request of one connection (`check`, its peer and
        place given): a refusal raises Forbidden, and is logged once per peer."""
        return partial(self.check, peer, where, own)

    def check(self, peer: Peer, where: str, own: str | None, req: p.Request) -> None:
        """Raise Forbidden naming the first part of `req` that `peer` may not do.

        `own` is the subscriber whose delivery connection carried the request:
        the peer there is whoever listens on the subscriber's socket (PID 1 for a
        systemd socket unit), so its credentials say nothing about the handler,
        and the connection may carry only that subscriber's acks (Acks, Nacks,
        Rejects, Touch) and RECONNECT.
        Unknown topics and subscribers pass: the broker answers them with 404.
        Each rule is looked at only where the request does what it governs: a
        config without such rules costs a request no call.
        """
        try:
            if own is not None:
                if req.messages is not None or req.command is not None or req.subscriber not in (None, own):
                    _check_delivery(req, own)  # what is neither an ack nor its subscriber's own may be refused
                return
            rules = self.rules  # one value for the whole request, whatever a reload does
            if rules is None:
                return
            if req.messages is not None and rules.publishers:
                _check_publish(rules, peer, req)
            if req.subscriber in rules.users:
                _check_subscriber(rules, peer, req)
            if req.command is not None:
                _check_command(rules, peer, req)
        except Forbidden as exc:
            self._refused(peer, where, exc)
            raise

    def _refused(self, peer: Peer, where: str, exc: Forbidden) -> None:
        """Log a refusal, once per peer process."""
        key = (peer.uid, peer.pid)
        if key in self._logged:
            return
        if len(self._logged) >= MAX_LOGGED_PEERS:
            self._logged.clear()
        self._logged.add(key)
        log.warning(
            "%s: refused (403) to user %s: %s; further refusals of this peer are counted, not logged",
            where,
            _user_name(peer.uid),
            exc,
        )

    def check_owner(self, sub: SubscriberConfig, uid: int, what: str) -> None:
        """Raise PermissionError unless `uid` may own subscriber `sub`'s socket."""
        rule = self.rules.owners.get(sub.name) if self.rules is not None else None
        if rule is not None and not rule.allows(Peer.of_uid(uid)):
            raise PermissionError(f"{what} is uid {uid} ({_user_name(uid)}), not root or one of the subscriber's Users (CheckOwner)")


DELIVERY_COMMANDS = ("RECONNECT", "CONNECT")
SUBSCRIBER_COMMANDS = (*DELIVERY_COMMANDS, "TAKE")  # act as the Subscriber: its Users decide (PROTOCOL §9)
ADMIN_COMMANDS = ("PEEK", "PURGE", "REDRIVE", "PAUSE", "RESUME")  # PROTOCOL §8 Access


def _command(req: p.Request) -> str:
    """The request's command as the broker matches it (commands are case-insensitive)."""
    return (req.command or "").upper()


def _acting_field(req: p.Request) -> str | None:
    """The first key by which `req` acts as its `Subscriber`, in the order the
    broker applies them, to name it in a refusal; None if it does not act as one.
    Nacks, Rejects and Touch follow the rules of Acks (PROTOCOL §8 Access)."""
    for field, keys in (("Acks", req.acks), ("Nacks", req.nacks), ("Rejects", req.rejects), ("Touch", req.touch)):
        if keys is not None:
            return field
    return "Command" if _command(req) in SUBSCRIBER_COMMANDS else None


def _check_publish(rules: Rules, peer: Peer, req: p.Request) -> None:
    """A topic's `Publishers` decide who may publish to it."""
    rule = rules.publishers.get(req.topic) if req.messages is not None and req.topic is not None else None
    if rule is not None and not rule.allows(peer):
        raise Forbidden(f"Messages: {_who(peer)} may not publish to topic {req.topic!r} (Publishers)")


def _check_subscriber(rules: Rules, peer: Peer, req: p.Request) -> None:
    """A subscriber's `Users` decide who may ack, nack, reject, touch, RECONNECT or TAKE as it."""
    rule = rules.users.get(req.subscriber or "")  # most subscribers have no Users: nothing to work out
    if rule is None or rule.allows(peer):
        return
    field = _acting_field(req)
    if field is not None:
        raise Forbidden(f"{field}: {_who(peer)} may not act as subscriber {req.subscriber!r} (Users)")


def _check_command(rules: Rules, peer: Peer, req: p.Request) -> None:
    """STATUS needs `StatusUsers`; the operator commands need `AdminUsers`, which
    StatusUsers does not stand in for: PEEK shows payloads. PING is anyone's."""
    command = _command(req)
    if command == "STATUS" and rules.status is not None and not rules.status.allows(peer):
        raise Forbidden(f"Command: {_who(peer)} may not ask STATUS (StatusUsers)")
    if command in ADMIN_COMMANDS and not rules.admin.allows(peer):
        raise Forbidden(f"Command: {_who(peer)} may not send {command} (AdminUsers)")


def _check_delivery(req: p.Request, own: str) -> None:
    """A delivery connection carries acks (Acks, Nacks, Rejects, Touch) and
    RECONNECT of its own subscriber, nothing else."""
    if req.messages is not None:
        field = "Messages"
    elif req.command is not None and _command(req) not in DELIVERY_COMMANDS:
        field = "Command"
    elif req.subscriber not in (None, own) and _acting_field(req) is not None:
        field = "Subscriber"
    else:
        return
    carried = "Acks, Nacks, Rejects, Touch and RECONNECT"
    raise Forbidden(f"{field}: the delivery connection of subscriber {own!r} carries only its {carried}")


def _who(peer: Peer) -> str:
    return f"uid {peer.uid}"


def _with_broker(rule: Rule) -> Rule:
    """`rule`, also admitting the broker's own user: it can read the store anyway."""
    rule.uids.add(os.geteuid())
    return rule


def _owner_rule(sub: SubscriberConfig) -> Rule:
    return _with_broker(Rule(sub.users or [], allow_root=True))
