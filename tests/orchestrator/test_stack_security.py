"""A stack as `cdiflow up` starts it, seen as its owner and as another local user: started from
a folder holding packages named like ours, it runs workflows (and survives its Redis and its
Postgres being killed); no secret it generated is in a log, a command line or an environment
another user may read; its data folder is private; everything listens on loopback; its CDI
controller answers nobody without the cluster's token.

One stack for the module (it takes a while to start); each test looks at one property.
"""

from __future__ import annotations

import contextlib
import grp
import ipaddress
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psutil
import pytest

from cdi.controller.client import ControllerClient
from cdi.controller.models import ObjectRecord
from cdi.errors import NotAuthenticated
from orchestrator.child_process import free_port
from orchestrator.stack import read_state
from orchestrator.stack.state import StackState
from workflows.samples import bundled_samples

OTHER_UID = 1003  # another local user: no group of the stack's, nothing of its own here
DEADLINE_S = 120.0
BOGUS = 'raise ImportError("a package from the working directory was imported")\n'
# What a client of a local stack is told to use; configured services are not this test's.
NOT_INHERITED = ("DATABASE_URL", "REDIS_URL", "S3_ENDPOINT_URL", "S3_BUCKET", "CDIFLOW_DATA_DIR",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "CDI_URL", "CDI_CONTROLLER_URL",
                 "CDI_CONTROLLER_TOKEN", "CDI_CONTROLLER_TOKEN_FILE")  # fmt: skip


@dataclass
class Running:
    data_dir: Path
    state: StackState
    outputs: str  # what every command the test ran printed (they may not show a secret)
    runs: list[str]  # how each workflow run ended

    def secrets(self) -> dict[str, str]:
        """Every secret the stack generated: the services' credentials, the admin key, the CDI
        cluster's keys and tokens."""
        found = {
            f"credentials.json:{name}": str(value)
            for name, value in json.loads((self.data_dir / "credentials.json").read_text()).items()
        }
        found["api-key"] = (self.data_dir / "api-key").read_text().strip()
        for path in (self.data_dir / "cdi" / "credentials").iterdir():
            found[f"cdi/credentials/{path.name}"] = path.read_text().strip()
        assert len(found) >= 10, found.keys()  # 5 service secrets, the admin key, 4 CDI ones
        return found

    def processes(self) -> list[psutil.Process]:
        """The supervisor and everything it started (and they started)."""
        supervisor = psutil.Process(self.state.supervisor.pid)
        return [supervisor, *supervisor.children(recursive=True)]


def _cdiflow(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``cdiflow`` as a user runs it (the installed command)."""
    command = [str(Path(sys.executable).parent / "cdiflow"), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip


def _eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {DEADLINE_S:g}s: {what}")
        time.sleep(0.2)


def _restarted(data_dir: Path, name: str, old_pid: int) -> bool:
    state = read_state(data_dir)
    row = next((p for p in state.processes if p.name == name), None) if state else None
    return row is not None and row.pid not in (None, old_pid) and row.alive()


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    folder = Path(tempfile.mkdtemp(prefix="cdiflow-sec-"))
    data_dir = folder / "data"
    bogus = folder / "cwd"
    for package in ("cdi", "orchestrator", "workflows"):  # what every child process imports
        (bogus / package).mkdir(parents=True)
        (bogus / package / "__init__.py").write_text(BOGUS)
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    folder_args = ("--data-dir", str(data_dir))
    outputs: list[str] = []

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = _cdiflow(*args, cwd=bogus, env=env)
        outputs.append(done.stdout + done.stderr)
        return done

    def workflow() -> str:
        sample = str(bundled_samples()["blue_sky.jpg"])
        done = run("run", "image_pipeline", "--input", sample, "--wait", *folder_args)
        return (
            "COMPLETED"
            if done.returncode == 0 and "COMPLETED" in done.stdout
            else (done.stdout + done.stderr)
        )

    try:
        up = run("up", "--detach", *folder_args, "--port", str(free_port()), "--workers", "1")
        assert up.returncode == 0, up.stdout + up.stderr
        state = read_state(data_dir)
        assert state is not None
        runs = [workflow()]
        # Error paths log too: Redis and Postgres killed, restarted by the supervisor.
        for name in ("redis", "postgres"):
            pid = next(p.pid for p in state.processes if p.name == name)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            _eventually(partial(_restarted, data_dir, name, pid), f"{name} restarted")
        runs.append(workflow())
        run("status", *folder_args)  # shows the owner the credentials: not checked below
        outputs.pop()
        yield Running(data_dir, read_state(data_dir) or state, "\n".join(outputs), runs)
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            _cdiflow("down", *folder_args, cwd=folder, env=env)
        left = read_state(data_dir)
        for proc in [left.supervisor, *left.processes] if left else []:
            if proc.alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_stack_runs_from_a_folder_holding_packages_named_like_ours(running: Running) -> None:
    """Child processes do not import from the working directory (``python -P``)."""
    assert running.runs == ["COMPLETED", "COMPLETED"]
    assert all(proc.alive() for proc in (running.state.supervisor, *running.state.processes))


def _as_other_user(script: str, *args: str) -> str:
    """What ``sh -c script`` prints run as ``OTHER_UID`` (system binaries only: our own
    interpreter's files may be unreadable to other users)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another local user")
    command = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
               "sh", "-c", script, "sh", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False).stdout


def test_no_secret_in_a_log_a_command_line_or_what_another_user_reads(running: Running) -> None:
    secrets = running.secrets()
    logs = [p for p in running.data_dir.rglob("*") if p.is_file() and p.suffix == ".log"]
    expected = {"stack.log", "api.log", "worker-1.log", "scheduler-1.log", "cdi-controller.log",
                "cdi-minion.log", "postgres.log", "redis.log", "s3.log"}  # fmt: skip
    assert {p.name for p in logs} >= expected
    texts = {str(p): p.read_text(errors="replace") for p in logs}
    texts["stack.json"] = (running.data_dir / "stack.json").read_text()
    texts["the commands' output"] = running.outputs
    for proc in psutil.process_iter():  # every command line on the machine (ps shows them all)
        with contextlib.suppress(psutil.Error):
            texts[f"argv of {proc.pid}"] = "\0".join(proc.cmdline())
    texts["ps as another user"] = _as_other_user("ps -eo args")
    pids = [str(p.pid) for p in running.processes()]
    texts["/proc/*/environ as another user"] = _as_other_user(
        'for p in "$@"; do cat /proc/$p/environ; done 2>/dev/null', *pids
    )
    leaks = [(name, where) for name, secret in secrets.items()
             for where, text in texts.items() if secret in text]  # fmt: skip
    assert leaks == []
    # The admin key and the CDI tokens are not where task code runs; the scheduler (no task
    # code) is named the reader token's file, the workers no CDI credential at all.
    for proc in running.processes():
        command = " ".join(proc.cmdline())
        if "orchestrator.scheduler" in command or "orchestrator.worker" in command:
            environment = "\0".join(f"{k}={v}" for k, v in proc.environ().items())
            given = [n for n, secret in secrets.items() if secret in environment]
            assert not [n for n in given if n.startswith(("api-key", "cdi/"))], command
        if "orchestrator.worker" in command:
            assert not [n for n in proc.environ() if n.startswith("CDI_CONTROLLER_TOKEN")], command


def test_the_data_folder_is_its_owners_alone(running: Running) -> None:
    """0700 (as root, 0710 to the embedded Postgres' own group: it must reach its data), every
    file in it 0600 or less, no folder others may enter; another user lists nothing."""
    top = running.data_dir.stat()
    mode = stat.S_IMODE(top.st_mode)
    if mode == 0o710:  # as root only, and only to a group with no member
        postgres = (running.data_dir / "postgres").stat()
        assert os.geteuid() == 0 and top.st_gid == postgres.st_gid != 0
        assert grp.getgrgid(top.st_gid).gr_mem == []
    else:
        assert mode == 0o700, oct(mode)
    loose = []
    for path in running.data_dir.rglob("*"):
        st = path.lstat()
        if (stat.S_ISDIR(st.st_mode) and st.st_mode & 0o007) or (
            stat.S_ISREG(st.st_mode) and st.st_mode & 0o077
        ):
            loose.append((str(path), oct(stat.S_IMODE(st.st_mode))))
    assert loose == []
    seen = _as_other_user('ls "$1" "$1/logs" 2>&1; cat "$1/logs/stack.log" 2>&1',
                          str(running.data_dir))  # fmt: skip
    assert seen.count("Permission denied") == 3 and "cdiflow starts" not in seen, seen


def test_every_listener_is_on_loopback(running: Running) -> None:
    listening = []
    for proc in running.processes():
        with contextlib.suppress(psutil.NoSuchProcess):
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    listening.append((proc.pid, " ".join(proc.cmdline()[:4]), conn.laddr.ip))
    kinds = " ".join(command for _, command, _ in listening)
    for part in ("orchestrator.controller", "orchestrator.worker", "cdi.controller", "postgres"):
        assert part in kinds, f"no listener of {part} found: {listening}"
    assert [row for row in listening if not _loopback(row[2])] == []


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return (mapped or ip).is_loopback


def test_the_cdi_controller_answers_nobody_without_the_clusters_token(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What another local user did: announce a host's minion with a fake object and a socket
    of their choosing, and list every container."""
    monkeypatch.delenv("CDI_CONTROLLER_TOKEN", raising=False)
    monkeypatch.delenv("CDI_CONTROLLER_TOKEN_FILE", raising=False)
    with ControllerClient(running.state.controller_url) as stranger:
        with pytest.raises(NotAuthenticated):
            stranger.register_minion("vm", "/tmp/evil.sock", objects=[ObjectRecord("f", 1, "", 1)])
        with pytest.raises(NotAuthenticated):
            stranger.list_containers()
    reader = (running.data_dir / "cdi" / "credentials" / "reader.token").read_text().strip()
    with ControllerClient(running.state.controller_url, token=reader) as directory:
        (minion,) = directory.list_minions()
        assert minion.socket_path == running.state.minion_socket and minion.alive
        assert [o.key for o in directory.list_objects() if o.key == "f"] == []
