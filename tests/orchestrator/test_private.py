"""The data folder and its files, private to their owner (``orchestrator.private``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.private import open_private, private_dir, write_private


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_folders_and_files_are_made_private_and_what_was_left_open_is_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old_umask = os.umask(0o022)  # a lax umask: what we make is private anyway
    try:
        made = private_dir(tmp_path / "new" / "data")
        assert _mode(made) == 0o700
        left_open = tmp_path / "old"
        left_open.mkdir(mode=0o755)
        private_dir(left_open)
        assert _mode(left_open) == 0o700 and "making it private" in caplog.text
        log = made / "api.log"
        log.write_text("earlier\n")
        log.chmod(0o644)
        os.close(open_private(log, os.O_WRONLY | os.O_APPEND))
        assert _mode(log) == 0o600 and log.read_text() == "earlier\n"
        write_private(made / "stack.json", "{}")
        assert _mode(made / "stack.json") == 0o600
        assert [p.name for p in made.iterdir() if p.name.startswith(".")] == []  # no tmp left
    finally:
        os.umask(old_umask)


def test_a_group_given_the_folder_keeps_its_search_bit_and_anothers_is_left_alone(
    tmp_path: Path,
) -> None:
    own_group = tmp_path / "own-group"
    own_group.mkdir()
    own_group.chmod(0o710)  # the owner's own group: no reason to let it in
    private_dir(own_group)
    assert _mode(own_group) == 0o700
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another group or user")
    searchable = tmp_path / "root-postgres"
    searchable.mkdir()
    os.chown(searchable, -1, 1003)
    searchable.chmod(0o750)  # as root, Postgres' own group reaches its data (search only)
    private_dir(searchable)
    assert _mode(searchable) == 0o710
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 1003, 1003)
    private_dir(theirs)  # not ours to change: no error, no change
    assert _mode(theirs) == 0o755
