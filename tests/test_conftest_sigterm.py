"""A test run that is stopped leaves no child process behind: SIGTERM unwinds the running test (its ``finally``
kills what it started: ``conftest.pytest_configure``), and a child started with ``deploy.support.die_with_parent``
(every ``regis_process``: the servers of the fault and deployment tests) dies with the test process even when that
is SIGKILLed. Before, a ``regis serve`` of tests/faults/test_leftovers.py ran on for an hour after a stopped run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deploy.support import wait_until

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent

INNER = '''
import os, subprocess, sys, time
from pathlib import Path

from deploy.support import die_with_parent


def test_holds_a_child():
    pidfile = Path(os.environ["CHILD_PIDFILE"])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                             preexec_fn=die_with_parent if os.environ.get("DIE_WITH_PARENT") else None)
    try:
        pidfile.write_text(str(child.pid))
        time.sleep(300)
    finally:
        child.kill()
        child.wait()
        pidfile.with_suffix(".finally").write_text("ran")
'''


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie is not: nothing may reap an orphan in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.fixture
def children():
    """Pids of the inner tests' children, SIGKILLed at teardown if a failed check left one running."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _run_and_stop(tmp_path: Path, signum: int, die_with_parent: bool, children: list[int]) -> tuple[int, Path, int]:
    """Start pytest on INNER (with the tests' conftest as a plugin), wait until its test holds a child, send
    ``signum`` to pytest; returns (pytest's exit status, the pid file, the child's pid)."""
    (tmp_path / "test_inner.py").write_text(INNER)
    pidfile = tmp_path / "child.pid"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path]), "CHILD_PIDFILE": str(pidfile),
           "DIE_WITH_PARENT": "1" if die_with_parent else ""}
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                              "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                             cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: pidfile.is_file() and pidfile.read_text().strip() != "", 120, 0.1,
                   what="the inner test's child")
        child = int(pidfile.read_text())
        children.append(child)
        assert _alive(child)
        inner.send_signal(signum)
        return inner.wait(timeout=60), pidfile, child
    finally:
        if inner.poll() is None:
            inner.kill()


def test_sigterm_runs_the_tests_finally_and_its_child_is_gone(tmp_path, children):
    status, pidfile, child = _run_and_stop(tmp_path, signal.SIGTERM, False, children)
    assert pidfile.with_suffix(".finally").read_text() == "ran"  # the test's cleanup ran
    assert status == pytest.ExitCode.INTERRUPTED  # pytest stopped as on Ctrl-C
    assert not _alive(child)


def test_sigkill_of_the_test_process_kills_a_child_started_with_die_with_parent(tmp_path, children):
    status, pidfile, child = _run_and_stop(tmp_path, signal.SIGKILL, True, children)
    assert status == -signal.SIGKILL and not pidfile.with_suffix(".finally").exists()  # no cleanup could run
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
