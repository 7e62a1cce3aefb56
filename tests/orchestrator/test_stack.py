"""``Stack`` and ``cdiflow up / status / down``: real processes, real services, real API.

The scheduler and workers are the real ones once their modules exist; until then stand-ins
take their place: a sleeper for the scheduler, and for a worker a loop that writes the
heartbeat hash the stack waits for. Every wait polls against a deadline; every test leaves
nothing running (the fixtures stop stacks by PID even when an assertion fails).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypedDict
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import pytest
import redis
from sqlalchemy.engine import make_url

import cdi
from orchestrator.child_process import free_port
from orchestrator.errors import StackError, StackRunning
from orchestrator.services import RunningServices
from orchestrator.stack import RestartPolicy, Stack, read_state
from orchestrator.stack.state import DataDirLock, ProcessInfo
from tests.cdi.conftest import minion_segment_folder

# Each stack gets a Redis database of its own (the API tests use 9): worker ids repeat across
# stacks, and a namesake's heartbeat must not pass for another stack's worker.
MODULE_REDIS_DB = 10
ONE_OFF_REDIS_DB = 11
CLI_REDIS_DB = 12
ORPHANS_REDIS_DB = 13
DEADLINE_S = 60.0

# Stand-in worker: heartbeats into the hash the stack waits for, until it is killed.
WORKER_STAND_IN = """
import os, sys, time, redis
from orchestrator.contract.keys import worker_key
client = redis.Redis.from_url(os.environ["REDIS_URL"])
started_at = time.time()
while True:
    beat = {"last_heartbeat": time.time(), "started_at": started_at}
    client.hset(worker_key(sys.argv[1]), mapping=beat)
    time.sleep(0.2)
"""
SLEEPER = "import time\nwhile True: time.sleep(1)"


def _exists(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class _Commands(TypedDict, total=False):
    scheduler_command: list[str]
    worker_command: list[str]


def _stand_ins() -> _Commands:
    """Stand-in commands for the pieces whose ``python -m`` entry point does not exist yet."""
    commands = _Commands()
    if not _exists("orchestrator.scheduler.__main__"):
        commands["scheduler_command"] = ["{python}", "-c", SLEEPER, "{id}"]
    if not _exists("orchestrator.worker.__main__"):
        commands["worker_command"] = ["{python}", "-c", WORKER_STAND_IN, "{id}"]
    return commands


def _eventually(check: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g}s: {what}")
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _redis_db(url: str, db: int) -> str:
    """``url`` on logical database ``db``, emptied."""
    url = urlunsplit(urlsplit(url)._replace(path=f"/{db}"))
    with contextlib.closing(redis.Redis.from_url(url)) as client:
        client.flushdb()
    return url


@pytest.fixture
def short_dir(short_dir: Path) -> Path:
    """The shared short folder's ``data``, not made yet (as on a first ``cdiflow up``)."""
    return short_dir / "data"


@pytest.fixture(scope="module")
def stack_services(
    service_stack: RunningServices, make_database: Callable[[str], str]
) -> RunningServices:
    """The session's services as if configured, with a database of this module's own."""
    return dataclasses.replace(
        service_stack,
        database_url=make_database("stack"),
        embedded=(),  # not the stacks' to stop
    )


@pytest.fixture
def own_services(stack_services: RunningServices) -> RunningServices:
    """Services for a one-off stack, on an emptied Redis database."""
    return dataclasses.replace(
        stack_services, redis_url=_redis_db(stack_services.redis_url, ONE_OFF_REDIS_DB)
    )


@pytest.fixture(scope="module")
def stack(stack_services: RunningServices) -> Iterator[Stack]:
    """One stack for the module: real API, two workers, fast restarts."""
    folder = Path(tempfile.mkdtemp(prefix="cdiflow-stack-"))
    policy = RestartPolicy(initial_backoff=0.05, max_backoff=0.5)
    try:
        with Stack(
            folder / "data",
            workers=2,
            port=free_port(),
            services=dataclasses.replace(
                stack_services, redis_url=_redis_db(stack_services.redis_url, MODULE_REDIS_DB)
            ),
            restart_policy=policy,
            **_stand_ins(),
        ) as running:
            yield running
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- the Python API -----------------------------------------------------------------------


def test_every_process_gets_the_stack_environment(stack: Stack) -> None:
    services = stack.services
    expected = {
        "DATABASE_URL": services.database_url,
        "REDIS_URL": services.redis_url,
        "S3_ENDPOINT_URL": services.s3_endpoint_url,
        "S3_BUCKET": services.s3_bucket,
        "CDI_URL": f"unix://{stack.minion_socket}",
        "CDI_CONTROLLER_URL": stack.controller_url,
        "CDIFLOW_DATA_DIR": str(stack.data_dir),
    }
    names = ["api", stack.scheduler_id, *stack.worker_ids]
    for name in names:
        pid = stack.pid_of(name)
        assert pid is not None, name
        env = psutil.Process(pid).environ()
        assert {key: env.get(key) for key in expected} == expected, name
        assert (stack.data_dir / "logs" / f"{name}.log").is_file()
        # The admin key goes to the API alone; no task code runs there.
        key_file = env.get("CDIFLOW_ADMIN_KEY_FILE")
        assert key_file == (str(stack.data_dir / "api-key") if name == "api" else None), name
        assert "CDIFLOW_ADMIN_KEY" not in env
    assert stack.controller_url.startswith("grpc://127.0.0.1:")
    assert Path(stack.minion_socket) == stack.data_dir / "cdi" / "minion.sock"
    assert Path(stack.minion_socket).is_socket()


def test_the_api_answers_and_the_table_lists_every_piece(stack: Stack) -> None:
    with urllib.request.urlopen(f"{stack.api_url}/api/healthz", timeout=10) as response:
        assert response.status == 200
    rows = {row.name: row for row in stack.processes()}
    expected = ["postgres", "redis", "s3", "cdi-controller", "cdi-minion", "api",
                stack.scheduler_id, *stack.worker_ids]  # fmt: skip
    assert list(rows) == expected
    assert rows["postgres"].pid is None  # configured services are not ours
    assert all(rows[name].alive() for name in expected[3:])


def test_a_killed_worker_is_restarted(stack: Stack) -> None:
    before = stack.restarts("worker-1")
    other = stack.pid_of("worker-2")
    killed = stack.kill_worker("worker-1", signal.SIGKILL)
    _eventually(lambda: stack.restarts("worker-1") > before, "worker-1 restarted")
    new_pid = stack.pid_of("worker-1")
    assert new_pid is not None and new_pid != killed
    assert not _gone(new_pid)
    assert stack.pid_of("worker-2") == other  # the others are left alone


def test_a_scheduler_that_exits_is_restarted(stack: Stack) -> None:
    before = stack.restarts(stack.scheduler_id)
    pid = stack.pid_of(stack.scheduler_id)
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    _eventually(lambda: stack.restarts(stack.scheduler_id) > before, "the scheduler restarted")
    assert stack.pid_of(stack.scheduler_id) != pid


def test_kill_worker_names_the_known_workers(stack: Stack) -> None:
    with pytest.raises(StackError, match="worker-1, worker-2"):
        stack.kill_worker("worker-9")


def test_a_second_stack_on_the_same_folder_is_refused(stack: Stack) -> None:
    second = Stack(stack.data_dir, port=free_port(), services=stack.services)
    with pytest.raises(StackRunning, match="already running"):
        second.preflight()
    try:
        with pytest.raises(StackRunning):
            second.start()
    finally:
        second.stop()  # a no-op unless start() wrongly succeeded


def test_stop_leaves_no_process_and_no_socket(
    own_services: RunningServices, short_dir: Path
) -> None:
    running = Stack(short_dir, workers=1, port=free_port(), services=own_services,
                    **_stand_ins()).start()  # fmt: skip
    try:
        pids = [row.pid for row in running.processes() if row.pid is not None]
        assert len(pids) == 5  # controller, minion, API, scheduler, one worker
    finally:
        running.stop()
    running.stop()  # idempotent
    assert [pid for pid in pids if not _gone(pid)] == []
    assert not Path(running.minion_socket).exists()
    assert not DataDirLock(short_dir).held_elsewhere()


def test_stop_frees_the_memory_of_a_minion_that_outlived_its_launcher(
    own_services: RunningServices, short_dir: Path
) -> None:
    """The minion's launcher killed and not yet restarted: the minion serves on for a
    successor, keeping its objects in /dev/shm. A stop of the stack is for good: that goes too
    (this stack's own folder: other runs' minions may have theirs beside it)."""
    policy = RestartPolicy(initial_backoff=60.0)  # no successor before the stop
    running = Stack(short_dir, workers=1, port=free_port(), services=own_services,
                    restart_policy=policy, **_stand_ins()).start()  # fmt: skip
    state = short_dir / "cdi" / "minion-state"
    segments = minion_segment_folder(state)
    try:
        with cdi.connect(running.minion_socket, "outlived") as client:
            client.create("outlived", 4096).access()[:4] = b"kept"
            running.kill("cdi-minion")
            assert client.stat()["objects"] == 1  # served on without its launcher
            assert segments.is_dir()
    finally:
        running.stop()
    assert not segments.exists()
    assert not (state / "journal").exists()


def test_a_taken_port_is_refused_before_anything_starts(
    own_services: RunningServices, short_dir: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = Stack(short_dir, port=port, services=own_services)
        try:
            with pytest.raises(StackError, match=f"port {port} .* --port"):
                refused.start()
        finally:
            refused.stop()  # a no-op unless start() wrongly succeeded
    assert not (short_dir / "logs").exists()  # nothing was started


def test_a_worker_that_cannot_start_is_reported_with_its_log(
    own_services: RunningServices, short_dir: Path
) -> None:
    crash = ["{python}", "-c", "import sys; print('worker {id} cannot start'); sys.exit(3)"]
    commands = _stand_ins()
    commands["worker_command"] = crash
    failing = Stack(short_dir, workers=1, port=free_port(), services=own_services, **commands)
    try:
        with pytest.raises(StackError, match="worker-1 exited with status 3") as caught:
            failing.start()
    finally:
        failing.stop()  # a no-op unless start() wrongly succeeded
    assert "worker worker-1 cannot start" in str(caught.value)
    assert caught.value.log_file == short_dir / "logs" / "worker-1.log"
    assert not Path(failing.minion_socket).exists()
    assert not DataDirLock(short_dir).held_elsewhere()  # stopped, lock released


def test_a_worker_whose_metrics_port_was_taken_starts_on_another(
    own_services: RunningServices, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port is drawn free for a worker's metrics; another process may bind it before the
    worker does. The stack starts that worker again on another port instead of failing."""
    import orchestrator.stack.worker_process as worker_process

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        draws = iter([port])
        monkeypatch.setattr(worker_process, "free_port", lambda: next(draws, None) or free_port())
        running = Stack(short_dir, workers=1, port=free_port(), services=own_services,
                        **_stand_ins()).start()  # fmt: skip
        try:
            url = running.worker_metrics["worker-1"]
            assert urlsplit(url).port not in (None, port)
            with urllib.request.urlopen(url, timeout=10) as reply:
                assert b"cdiflow_worker" in reply.read()
            log = (short_dir / "logs" / "worker-1.log").read_text()
            assert "Address already in use" in log  # the first start did meet the taken port
        finally:
            running.stop()


def test_a_worker_whose_port_was_taken_while_it_was_down_comes_back_on_another(
    own_services: RunningServices, short_dir: Path
) -> None:
    """The supervisor relaunches a dead worker on its port; if another process took that port
    while it was down, the relaunch meets it taken, and the next one draws another: the worker
    serves its metrics there, and the stack's metrics URL follows."""
    running = Stack(short_dir, workers=1, port=free_port(), services=own_services,
                    restart_policy=RestartPolicy(initial_backoff=3.0),
                    **_stand_ins()).start()  # fmt: skip
    try:
        url = running.worker_metrics["worker-1"]
        port = urlsplit(url).port
        assert port is not None
        running.kill_worker("worker-1")
        with socket.socket() as taken:  # within the 3 s back-off, once the worker let it go
            _eventually(lambda: _bound(taken, port), f"port {port} free to take", timeout=3.0)
            taken.listen()
            _eventually(lambda: running.restarts("worker-1") >= 2, "two relaunches", 60.0)

            def serving() -> bool:
                moved = running.worker_metrics["worker-1"]
                if moved == url:
                    return False
                try:
                    with urllib.request.urlopen(moved, timeout=10) as reply:
                        return b"cdiflow_worker" in reply.read()
                except OSError:  # not listening yet
                    return False

            _eventually(serving, "metrics on another port", 60.0)
        log = (short_dir / "logs" / "worker-1.log").read_text()
        assert "Address already in use" in log  # the first relaunch did meet the taken port
    finally:
        running.stop()


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def test_restart_policy_backs_off_then_caps_restarts_per_minute() -> None:
    policy = RestartPolicy(max_per_minute=3, initial_backoff=0.5, max_backoff=4.0)
    assert [policy.delay(100.0, [], n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    # Three restarts in the window: the next waits until the oldest is a minute old.
    assert policy.delay(100.0, [50.0, 60.0, 90.0], 1) == pytest.approx(10.0)
    assert policy.delay(100.0, [60.0, 90.0], 1) == 0.5


# -- the CLI, as a user runs it -----------------------------------------------------------


def _cli() -> list[str]:
    """``cdiflow``, as a user runs it."""
    return [sys.executable, "-m", "cdiflow"]


def _cli_env(**extra: str) -> dict[str, str]:
    """Our environment without anything that points cdiflow at other services."""
    drop = {
        "DATABASE_URL", "REDIS_URL", "S3_ENDPOINT_URL", "S3_BUCKET", "CDIFLOW_DATA_DIR",
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "CDI_URL", "CDI_CONTROLLER_URL",
    }  # fmt: skip
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


def _stand_in_options() -> list[str]:
    commands = _stand_ins()
    options = []
    if "scheduler_command" in commands:
        options += ["--scheduler-command", shlex.join(commands["scheduler_command"])]
    if "worker_command" in commands:
        options += ["--worker-command", shlex.join(commands["worker_command"])]
    return options


def _http_status(url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # Longer than `up`'s own wait (300 s): a slow `up --detach` then gives up and stops the
    # stack it started, where a command killed by this timeout would leave it running.
    return subprocess.run(
        [*_cli(), *args], env=env, capture_output=True, text=True, timeout=420, check=False
    )


def _pids(state_file_dir: Path) -> list[ProcessInfo]:
    state = read_state(state_file_dir)
    assert state is not None
    return [state.supervisor, *(p for p in state.processes if p.pid is not None)]


@contextlib.contextmanager
def _cleanup(data_dir: Path, env: dict[str, str]) -> Iterator[None]:
    """Whatever happens in the test, stop the stack from ``data_dir`` (down, then by PID)."""
    try:
        yield
    finally:
        state = read_state(data_dir)
        if state is not None:
            _run("down", "--data-dir", str(data_dir), env=env)
            for proc in [state.supervisor, *state.processes]:
                if proc.alive() and proc.pid is not None:
                    os.kill(proc.pid, signal.SIGKILL)


def test_cli_up_detach_status_down(short_dir: Path) -> None:
    env = _cli_env()  # nothing configured: embedded Postgres, Redis and S3
    port = free_port()
    folder = ["--data-dir", str(short_dir)]
    with _cleanup(short_dir, env):
        up = _run("up", "--detach", *folder, "--port", str(port), "--workers", "1",
                  *_stand_in_options(), env=env)  # fmt: skip
        assert up.returncode == 0, up.stderr + up.stdout
        assert f"http://127.0.0.1:{port}" in up.stdout and "worker-1" in up.stdout
        procs = _pids(short_dir)
        names = [p.name for p in procs]
        assert names == ["supervisor", "postgres", "redis", "s3", "cdi-controller",
                         "cdi-minion", "api", "scheduler-1", "worker-1"]  # fmt: skip
        assert all(p.alive() for p in procs)

        status = _run("status", *folder, env=env)
        assert status.returncode == 0, status.stderr
        assert status.stdout.count("running") == len(procs)
        report = json.loads(_run("status", "--json", *folder, env=env).stdout)
        assert report["running"] is True
        assert all(p["alive"] for p in report["processes"])
        # The admin key: made at the first start, private to its owner, shown to them by
        # `status --json`, announced (not printed) by `up`; the API takes it and nothing less.
        key_file = short_dir / "api-key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert report["api_key"] == key_file.read_text().strip()
        assert report["api_url"] == f"http://127.0.0.1:{port}"
        assert str(key_file) in up.stdout and report["api_key"] not in up.stdout
        assert _http_status(f"{report['api_url']}/api/whoami", report["api_key"]) == 200
        assert _http_status(f"{report['api_url']}/api/whoami", None) == 401
        # The folder's owner is shown what a client needs, and it lets the client in.
        database_url = report["credentials"]["database_url"]
        assert _postgres_answers(database_url)
        assert "credentials of the embedded services" in status.stdout
        # Retention, as the API keeps it: the default, and what pruning has done.
        assert "retention: finished runs kept 30 days, results keep" in status.stdout
        assert report["retention"]["default_days"] == 30
        assert report["retention"]["runs_on_record"] == 0

        # The supervisor restarts a killed Postgres on its port: the same URL answers again.
        postgres = procs[1]
        assert postgres.name == "postgres" and postgres.pid is not None
        os.kill(postgres.pid, signal.SIGKILL)
        _eventually(
            lambda: (row := _pids(short_dir)[1]).pid != postgres.pid and row.restarts == 1,
            "stack.json shows Postgres restarted",
        )
        _eventually(lambda: _postgres_answers(database_url), "Postgres answers again")
        table = _run("status", *folder, env=env).stdout.splitlines()
        row = next(line.split() for line in table if line.startswith("postgres "))
        assert row[2:4] == ["running", "1"]  # STATE, RESTARTS

        # The supervisor restarts a killed worker and republishes its new PID.
        worker = procs[-1]
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        _eventually(lambda: _pids(short_dir)[-1].pid != worker.pid, "stack.json has a new PID")
        procs = _pids(short_dir)
        assert procs[-1].name == "worker-1" and procs[-1].alive()

        again = _run("up", "--detach", *folder, "--port", str(free_port()), env=env)
        assert again.returncode != 0
        assert "already running" in again.stderr

        down = _run("down", *folder, env=env)
        assert down.returncode == 0, down.stderr
        assert [p.name for p in procs if not _gone(p.pid or 0)] == []
        assert read_state(short_dir) is None
        assert not (short_dir / "cdi" / "minion.sock").exists()
        assert _run("status", *folder, env=env).returncode == 1


def _postgres_answers(url: str) -> bool:
    try:
        with psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(
            hide_password=False), connect_timeout=3) as conn:  # fmt: skip
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.Error:
        return False


def _configured_env(services: RunningServices, database_url: str, redis_db: int) -> dict[str, str]:
    """The CLI's environment pointing at running services, as production points at managed
    ones: nothing embedded is started."""
    return _cli_env(
        DATABASE_URL=database_url,
        REDIS_URL=_redis_db(services.redis_url, redis_db),
        S3_ENDPOINT_URL=services.s3_endpoint_url,
        AWS_ACCESS_KEY_ID=services.aws_access_key_id or "",
        AWS_SECRET_ACCESS_KEY=services.aws_secret_access_key or "",
    )


def test_cli_up_in_the_foreground_stops_on_ctrl_c(
    stack_services: RunningServices, make_database: Callable[[str], str], short_dir: Path
) -> None:
    env = _configured_env(stack_services, make_database("stack_cli"), CLI_REDIS_DB)
    args = ["up", "--data-dir", str(short_dir), "--port", str(free_port()), "--workers", "1"]
    output = short_dir.parent / "up.out"
    with _cleanup(short_dir, env), output.open("wb") as out:
        # Its own session stands in for a terminal: Ctrl-C goes to the foreground group.
        up = subprocess.Popen([*_cli(), *args, *_stand_in_options()], env=env, stdout=out,
                              stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            _eventually(lambda: read_state(short_dir) is not None or up.poll() is not None,
                        "the foreground stack is up")  # fmt: skip
            assert up.poll() is None, output.read_text()
            procs = _pids(short_dir)
            _eventually(lambda: "Press Ctrl-C" in output.read_text(), "up printed its table")
            os.killpg(up.pid, signal.SIGINT)
            assert up.wait(timeout=DEADLINE_S) == 0, output.read_text()
        finally:
            if up.poll() is None:
                up.kill()
                up.wait()
    assert [p.name for p in procs if not _gone(p.pid or 0)] == []
    assert read_state(short_dir) is None
    assert "stack stopped" in output.read_text()


def test_cli_up_refuses_a_taken_port(short_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = _run("up", "--detach", "--data-dir", str(short_dir), "--port", str(port),
                  env=_cli_env())  # fmt: skip
    assert up.returncode != 0
    assert "--port" in up.stderr
    assert read_state(short_dir) is None


def test_cli_demo_on_a_taken_port_says_so_without_a_traceback(short_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        demo = _run("demo", "--data-dir", str(short_dir), "--port", str(port), env=_cli_env())
    assert demo.returncode == 1, demo.stderr + demo.stdout
    assert f"Error: port {port} on 127.0.0.1 is already in use" in demo.stderr, demo.stderr
    assert "Traceback" not in demo.stderr
    assert read_state(short_dir) is None


def test_cli_down_cleans_up_after_a_dead_supervisor(
    stack_services: RunningServices, make_database: Callable[[str], str], short_dir: Path
) -> None:
    env = _configured_env(stack_services, make_database("stack_orphans"), ORPHANS_REDIS_DB)
    folder = ["--data-dir", str(short_dir)]
    with _cleanup(short_dir, env):
        up = _run("up", "--detach", *folder, "--port", str(free_port()), "--workers", "1",
                  *_stand_in_options(), env=env)  # fmt: skip
        assert up.returncode == 0, up.stderr + up.stdout
        supervisor, *orphans = _pids(short_dir)
        assert supervisor.pid is not None
        os.kill(supervisor.pid, signal.SIGKILL)  # its processes live on, orphaned
        _eventually(lambda: not supervisor.alive(), "the supervisor is gone")

        status = _run("status", *folder, env=env)
        assert status.returncode == 1 and "stale" in status.stdout
        again = _run("up", "--detach", *folder, "--port", str(free_port()), env=env)
        assert again.returncode != 0 and "cdiflow down" in again.stderr

        down = _run("down", *folder, env=env)
        assert down.returncode == 0, down.stderr
        assert [p.name for p in orphans if not _gone(p.pid or 0)] == []
        assert read_state(short_dir) is None
        assert not (short_dir / "cdi" / "minion.sock").exists()
