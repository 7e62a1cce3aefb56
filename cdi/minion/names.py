"""Which uid may register which container id: the minion's name rules (``--names``).

A rule is ``PATTERN=UID``: ``PATTERN`` is a container id, or a prefix ending in ``*``; ``UID`` a
number or a user name. The first rule that matches an id decides which uid may register it; an id
no rule matches may be registered only by the minion's own uid. So a process of another uid can
never take the name a container of the stack will register (and so receive its objects).

The rules are parsed and their user names resolved here; the minion applies them
(``cdi/minion-native/src/args.rs``, ``uid_for``).
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass

from cdi.errors import ConfigError
from cdi.protocol import check_container_id

__all__ = ["NameRule", "parse_names"]


@dataclass(frozen=True)
class NameRule:
    pattern: str
    """A container id, or a prefix ending in ``*``."""
    uid: int

    def __str__(self) -> str:
        return f"{self.pattern}={self.uid}"


def parse_names(spec: str) -> tuple[NameRule, ...]:
    """``"worker-*=10004,scheduler-*=cdiflow"`` -> rules, in order."""
    rules = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        pattern, sep, who = part.partition("=")
        if not sep or not pattern or not who:
            raise ConfigError(f"--names {part!r}: write PATTERN=UID, e.g. worker-*=10004")
        stem = pattern[:-1] if pattern.endswith("*") else pattern
        if stem:
            try:
                check_container_id(stem)
            except Exception as exc:
                raise ConfigError(f"--names {part!r}: {exc}") from exc
        rules.append(NameRule(pattern, _uid(who, part)))
    return tuple(rules)


def _uid(who: str, part: str) -> int:
    if who.isdigit():
        return int(who)
    try:
        return pwd.getpwnam(who).pw_uid
    except KeyError:
        raise ConfigError(f"--names {part!r}: no user {who!r} on this machine") from None
