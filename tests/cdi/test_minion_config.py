"""The minion's access configuration: name rules and the socket's group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.errors import ConfigError
from cdi.minion.cli import _group
from cdi.minion.config import check_socket_dir
from cdi.minion.names import NameRule, parse_names, uid_for


@pytest.fixture(scope="module", autouse=True)
def minion_impl() -> str:
    """No minion runs here: one pass, not one per implementation."""
    return "none"


def test_the_first_matching_rule_decides_and_the_rest_is_the_minions() -> None:
    rules = parse_names(" worker-*=1001, worker-admin=0 ,sched=root,")
    assert rules == (NameRule("worker-*", 1001), NameRule("worker-admin", 0), NameRule("sched", 0))
    assert uid_for(rules, "worker-7", 42) == 1001
    assert uid_for(rules, "worker-admin", 42) == 1001  # the prefix rule came first
    assert uid_for(rules, "sched", 42) == 0
    assert uid_for(rules, "sched-2", 42) == 42  # an exact name is not a prefix
    assert uid_for((), "anything", 42) == 42
    assert str(rules[0]) == "worker-*=1001"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("worker", "PATTERN=UID"),
        ("=1001", "PATTERN=UID"),
        ("worker-*=", "PATTERN=UID"),
        ("bad name*=1", "characters outside"),
        ("w=no-such-user-here", "no user"),
    ],
)
def test_bad_rules_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_names(spec)


def test_a_socket_folder_another_user_controls_is_refused(tmp_path: Path) -> None:
    """A folder someone else made first (in /tmp, say) could have the minion's socket swapped
    for theirs: the minion does not start there."""
    theirs = tmp_path / "cdi-theirs"
    theirs.mkdir()
    if os.geteuid() == 0:
        os.chown(theirs, 1003, 1003)
    else:
        theirs.chmod(0o777)  # not sticky: anyone may replace what is in it
    refused = subprocess.run(
        [sys.executable, "-m", "cdi.minion", "--socket", str(theirs / "minion.sock")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "could put another socket" in refused.stderr
    assert not (theirs / "minion.sock").exists()
    with pytest.raises(ConfigError, match="a folder of your own"):
        check_socket_dir(str(theirs / "minion.sock"))
    check_socket_dir(str(tmp_path / "missing" / "minion.sock"))  # made by the minion, ours
    sticky = tmp_path / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp itself: nobody may replace another's file
    check_socket_dir(str(sticky / "minion.sock"))


def test_socket_groups_by_name_or_number() -> None:
    assert _group("1100") == 1100
    assert _group("root") == 0
    with pytest.raises(ConfigError, match="no such group"):
        _group("no-such-group-here")
