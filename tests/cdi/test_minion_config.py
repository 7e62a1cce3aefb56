"""The minion's access configuration: name rules and the socket's group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.errors import ConfigError
from cdi.minion.cli import _group
from cdi.minion.config import MinionConfig, check_socket_dir
from cdi.minion.names import NameRule, parse_names


def test_rules_keep_their_order_and_user_names_become_uids() -> None:
    """Which rule decides is the minion's (``uid_for`` in ``args.rs``, with its unit test);
    here: the rules it is given, in order, as numbers."""
    rules = parse_names(" worker-*=1001, worker-admin=0 ,sched=root,")
    assert rules == (NameRule("worker-*", 1001), NameRule("worker-admin", 0), NameRule("sched", 0))
    assert ",".join(map(str, rules)) == "worker-*=1001,worker-admin=0,sched=0"


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


# -- what the minion is given to prove itself: refused at start when it cannot be ------------

PLACEHOLDER_TOKEN = "CHANGE-ME: the minion-any-host.token file of cdiflow cdi credentials"


def _minion_config(monkeypatch: pytest.MonkeyPatch, token: str) -> MinionConfig:
    from cdi.minion.cli import _config

    monkeypatch.delenv("CDI_CONTROLLER_TOKEN_FILE", raising=False)
    monkeypatch.setenv("CDI_CONTROLLER_TOKEN", token)
    return _config(
        socket_path="/tmp/nowhere.sock", host="node-1", controller_url="grpc://127.0.0.1:9",
        controller_token_file=None, memory_limit=None, max_object="1MiB",
        isolation="cooperative", prewarm="", busy_poll_us=0, names="", socket_group=None,
    )  # fmt: skip


def test_a_minion_refuses_a_placeholder_or_a_token_of_another_role(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Secret left as shipped stops the minion before it serves, saying what it needs and
    never repeating what it was given; so does a token made for another process."""
    from cdi.auth import Role, mint_token, new_key

    with pytest.raises(ConfigError, match="not a CDI token") as refused:
        _minion_config(monkeypatch, PLACEHOLDER_TOKEN)
    assert PLACEHOLDER_TOKEN not in str(refused.value)
    reader = mint_token(new_key(), Role.READER, "cluster-tools")
    with pytest.raises(ConfigError, match="a reader token; this process needs a minion token"):
        _minion_config(monkeypatch, reader)
    minion = mint_token(new_key(), Role.MINION, "*")
    assert _minion_config(monkeypatch, minion).controller_token == minion


@pytest.mark.parametrize(
    "key",
    ["CHANGE-ME-TO-THE-GATEWAY-KEY-OF-CDIFLOW-CDI-CREDENTIALS", "ab" * 20,
     "replace_me_with_gateway.key_0123456789"],
)  # fmt: skip
def test_a_placeholder_key_is_refused_saying_so(key: str) -> None:
    """The gateway key and the cluster key (``check_key``): long enough is not enough."""
    from cdi.auth import check_key, new_key

    with pytest.raises(ConfigError, match="the gateway key is not a secret") as refused:
        check_key(key, "gateway key")
    assert key not in str(refused.value)
    fresh = new_key()
    assert check_key(fresh, "gateway key") == fresh
