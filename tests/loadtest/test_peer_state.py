"""A peer's own state folder: what its processes see instead of the user's home and settings."""

from __future__ import annotations

import stat
from pathlib import Path

from loadtest.systems.peer_state import PeerState


def test_a_peers_environment_names_its_own_folders_and_none_of_the_users_settings() -> None:
    state = PeerState("test")
    try:
        user = {
            "PATH": "/usr/bin", "HOME": "/home/someone", "TMPDIR": "/var/tmp",
            "RAY_ADDRESS": "10.0.0.9:6379", "RAY_AUTH_TOKEN": "theirs", "CELERY_BROKER_URL": "x",
            "CONDUCTOR_AUTH_KEY": "k", "TEMPORAL_ADDRESS": "t:7233", "S3_BUCKET": "cdiflow",
        }  # fmt: skip
        env = state.env(user)
        assert env["PATH"] == "/usr/bin" and env["S3_BUCKET"] == "cdiflow"
        assert not [k for k in env if k.startswith(("RAY_", "CELERY_", "CONDUCTOR_", "TEMPORAL_"))]
        assert env["HOME"] == str(state.home) and env["TMPDIR"] == str(state.tmp)
        for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
            assert Path(env[name]).is_relative_to(state.home), name
        # Nobody else may look in: the folder and the home are the owner's alone.
        for folder in (state.root, state.home, state.tmp):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
        secret = state.secret_file(".ray/auth_token")
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        assert len(secret.read_text()) == 64 and secret.read_text() != "theirs"
        assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    finally:
        state.remove()
    assert not state.root.exists()
