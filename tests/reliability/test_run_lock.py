"""The run lock is atomic: of many concurrent starters on one directory at most one holds it at any time, with and
without a stale lock left by a dead process, and a lock file that is still empty because its writer has not
written yet reads as held, never as stale."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import warnings

import pytest

from lightning_fl.federation.run_lock import RunLock
from tests.conftest import REPO

STARTERS = 6


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _starter(run: str, trials: int, barrier, overlaps, holds) -> None:
    """Each trial: wait for every starter, try to take the lock, and while holding it claim an O_EXCL marker that a
    second holder could not claim."""
    warnings.simplefilter("ignore")
    marker = os.path.join(run, "holder")
    for _ in range(trials):
        barrier.wait()
        lock = RunLock(run)
        try:
            lock.acquire()
        except RuntimeError:
            barrier.wait()
            continue
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            holds.value += 1
            time.sleep(0.005)  # hold long enough for a second holder to meet the marker
            os.unlink(marker)
        except FileExistsError:
            overlaps.value += 1
        finally:
            lock.release()
        barrier.wait()


def _concurrent_trials(run, trials: int, *, stale_pid: int | None) -> tuple[int, int]:
    """(trials with two holders at once, holds) over ``trials`` rounds of :data:`STARTERS` starters."""
    ctx = multiprocessing.get_context("fork")
    barrier, overlaps, holds = ctx.Barrier(STARTERS + 1), ctx.Value("i", 0, lock=True), ctx.Value("i", 0, lock=True)
    starters = [
        ctx.Process(target=_starter, args=(str(run), trials, barrier, overlaps, holds)) for _ in range(STARTERS)
    ]
    for process in starters:
        process.start()
    lock_path = run / ".lightning-fl.lock"
    for _ in range(trials):
        if stale_pid is not None:  # a run killed before it could release the lock
            lock_path.write_text(json.dumps({"pid": stale_pid, "host": socket.gethostname()}))
        barrier.wait()  # go
        barrier.wait()  # every starter done with this trial
    for process in starters:
        process.join(timeout=60)
    assert all(p.exitcode == 0 for p in starters)
    return overlaps.value, holds.value


@pytest.mark.parametrize("stale", [False, True], ids=["no-lock", "stale-lock"])
def test_concurrent_starters_never_both_hold_the_lock(tmp_path, stale: bool) -> None:
    overlaps, holds = _concurrent_trials(tmp_path, 50, stale_pid=_dead_pid() if stale else None)
    assert overlaps == 0
    assert holds >= 50  # every trial has a holder (the lock was free or stale each time)


@pytest.mark.slow
@pytest.mark.parametrize("stale", [False, True], ids=["no-lock", "stale-lock"])
def test_a_thousand_concurrent_trials_never_see_two_holders(tmp_path, stale: bool) -> None:
    overlaps, holds = _concurrent_trials(tmp_path, 1000, stale_pid=_dead_pid() if stale else None)
    assert overlaps == 0 and holds >= 1000


def test_an_empty_lock_file_whose_writer_is_alive_reads_as_held(tmp_path) -> None:
    lock = RunLock(tmp_path)
    fd = os.open(lock.path, os.O_RDWR | os.O_CREAT)  # created and locked, its pid not written yet
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(RuntimeError, match="in use by another lightning-fl run \\(a run that is starting\\)"):
            RunLock(tmp_path).acquire()
        with pytest.raises(RuntimeError, match="a run that is starting"):
            RunLock(tmp_path).check()
        assert lock.path.exists() and os.fstat(fd).st_ino == os.stat(lock.path).st_ino  # nobody took it over
    finally:
        os.close(fd)


def test_an_empty_lock_file_left_by_a_dead_writer_is_taken(tmp_path) -> None:
    lock = RunLock(tmp_path)
    lock.path.write_text("")
    lock.acquire()
    assert lock.holder() == {"pid": os.getpid(), "host": socket.gethostname()}
    lock.release()
    assert not lock.path.exists()


_OWNER_WITH_A_CHILD = """
import multiprocessing, sys, time
from lightning_fl.federation.run_lock import RunLock

RunLock(sys.argv[1]).acquire()
child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,))
child.start()  # a worker forked while the lock is held, as a bench's --jobs 2 pool is
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_forked_child_keeps_no_lock_of_an_owner_killed_with_sigkill(tmp_path) -> None:
    """The workers of a bench killed with SIGKILL inherited its lock descriptor and kept the ``flock``: every later
    run was refused, naming a pid that no longer ran, for as long as they lived. Now the stale lock is taken over
    with a warning, and a live owner is still refused."""
    script = [sys.executable, "-c", _OWNER_WITH_A_CHILD, str(tmp_path)]
    owner = subprocess.Popen(script, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    child = int(owner.stdout.readline())
    try:
        with pytest.raises(RuntimeError, match=rf"is in use by another lightning-fl run \(pid {owner.pid} on "):
            RunLock(tmp_path).acquire()  # the owner runs: refused
        owner.kill()
        owner.wait()
        os.kill(child, 0)  # the child outlives its owner (it is a plain fork, not a bench worker)
        lock = RunLock(tmp_path)
        with pytest.warns(
            UserWarning, match=rf"locked by pid {owner.pid} on .*, which no longer runs; taking the lock"
        ):
            lock.acquire()
        assert lock.holder()["pid"] == os.getpid()
        lock.release()
    finally:
        os.kill(child, 9)
