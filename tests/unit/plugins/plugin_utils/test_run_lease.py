# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A run's lease with real processes: its keeper renews it while the run lives, and stops when it dies."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time

import pytest

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import run_lease
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_run import process_start_ticks


def keeper_holds(path):
    """Whether a keeper holds the lease's flock (a second one cannot take it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def wait_until(predicate, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_lease_is_renewed_while_the_run_lives_and_left_stale_when_it_dies(tmp_path):
    run_proc = subprocess.Popen(["sleep", "60"])  # stands for the run's ansible-playbook process
    try:
        run = {"run_id": "ctl-%d-1" % run_proc.pid, "controller": "ctl", "pid": run_proc.pid, "awx_job_id": "4711"}
        path = run_lease.start(str(tmp_path / "report"), run, process_start_ticks(run_proc.pid), "2026-12-02T10:00:00Z",
                               renew_s=0.2, watch_s=0.05)
        assert path == str(tmp_path / "report" / "runs" / ("ctl-%d-1.lease" % run_proc.pid))
        assert json.loads(open(path).read()) == {
            "run_id": run["run_id"], "controller": "ctl", "pid": run_proc.pid, "awx_job_id": "4711", "renew_s": 0.2,
            "started_at": "2026-12-02T10:00:00Z"}
        assert wait_until(lambda: keeper_holds(path))
        # Renewed: the modification time moves on while the run lives.
        first = os.stat(path).st_mtime
        assert wait_until(lambda: os.stat(path).st_mtime > first + 0.1)
        assert run_lease.read(path, stale_s=5)["alive"] is True
        # A second start of the same run (another worker) keeps the one keeper.
        assert run_lease.start(str(tmp_path / "report"), run, process_start_ticks(run_proc.pid), "later") == path
        assert json.loads(open(path).read())["started_at"] == "2026-12-02T10:00:00Z"
    finally:
        run_proc.kill()
        run_proc.wait()
    # The run is gone: the keeper lets go, and the lease stops moving.
    assert wait_until(lambda: not keeper_holds(path))
    last = os.stat(path).st_mtime
    time.sleep(0.5)
    assert os.stat(path).st_mtime == last
    seen = run_lease.read(path, now=last + 301)
    assert seen["alive"] is False and seen["age_s"] == pytest.approx(301, abs=0.01)
    assert "not renewed for 301 s (stale after 300 s)" in seen["reason"]
    assert seen["lease"]["awx_job_id"] == "4711"


def test_a_pid_reused_by_another_process_does_not_keep_the_lease(tmp_path):
    run_proc = subprocess.Popen(["sleep", "60"])
    try:
        run = {"run_id": "ctl-%d-1" % run_proc.pid, "controller": "ctl", "pid": run_proc.pid}
        # Start ticks that are not this process's: the keeper sees another process under the pid.
        path = run_lease.start(str(tmp_path), run, (process_start_ticks(run_proc.pid) or 0) + 12345, "t",
                               renew_s=0.2, watch_s=0.05)
        time.sleep(0.5)
        assert not keeper_holds(path)
    finally:
        run_proc.kill()
        run_proc.wait()


def test_a_lease_that_cannot_be_seen_is_unknown_and_a_bad_run_id_is_refused(tmp_path):
    seen = run_lease.read(str(tmp_path / "elsewhere" / "runs" / "x.lease"))
    assert seen["alive"] is None and "cannot be seen here" in seen["reason"]
    for bad in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            run_lease.lease_path(str(tmp_path), bad)


def _lease(runs, name, mtime=None, **content):
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / ("%s.lease" % name)
    path.write_text(json.dumps(dict({"run_id": name, "controller": "other-ctl", "pid": 9}, **content)))
    if mtime is not None:
        os.utime(str(path), (mtime, mtime))
    return path


def test_the_lease_is_found_by_the_locks_run_id_under_this_controllers_runs_never_at_the_nodes_path(tmp_path):
    runs = tmp_path / "report" / "runs"
    _lease(runs, "other-ctl-9-1", mtime=1000.0)
    old = tmp_path / "old.lease"
    old.write_text("{}")
    os.utime(str(old), (0.0, 0.0))
    for named in (str(old), "/proc/self/stat", str(tmp_path)):
        lock = {"run_id": "other-ctl-9-1", "controller": "other-ctl", "pid": 9, "lease": named}
        seen = run_lease.probe_holder(lock, str(runs), now=1010.0)
        assert seen == {"alive": True, "reason": "lease %s renewed 10 s ago" % (runs / "other-ctl-9-1.lease")}, named
    # No lease of that run here: unknown, never 'gone'.
    seen = run_lease.probe_holder({"run_id": "other-ctl-9-2", "controller": "other-ctl", "pid": 9}, str(runs), 1010.0)
    assert seen["alive"] is None and seen["reason"].endswith("other-ctl-9-2.lease cannot be seen here (absent)")
    seen = run_lease.probe_holder({"run_id": "../../etc/x", "controller": "other-ctl"}, str(runs), 1010.0)
    assert seen["alive"] is None and "names no lease" in seen["reason"]


def test_a_lease_of_another_run_from_the_future_or_unreadable_is_unknown(tmp_path):
    runs = tmp_path / "runs"
    path = _lease(runs, "a-1-1", mtime=1000.0, run_id="b-2-2")
    seen = run_lease.read(str(path), now=1010.0, run_id="a-1-1")
    assert seen["alive"] is None
    assert seen["reason"] == "lease %s names run 'b-2-2', not the lock's run a-1-1: the holder's liveness is unknown" % path
    path = _lease(runs, "c-1-1", mtime=2000.0)
    seen = run_lease.read(str(path), now=1000.0, run_id="c-1-1")
    assert seen["alive"] is None and seen["reason"] == (
        "lease %s was modified 1000 s in the future of this controller's clock (clock skew between controllers?): "
        "the holder's liveness is unknown" % path)
    assert run_lease.read(str(path), now=1997.0, run_id="c-1-1")["alive"] is True   # within FUTURE_S
    (runs / "d-1-1.lease").mkdir()
    seen = run_lease.read(str(runs / "d-1-1.lease"), now=1.0, run_id="d-1-1")
    assert seen["alive"] is None and seen["reason"] == "unreadable: %s: a directory: the run's liveness is unknown" % (
        runs / "d-1-1.lease")


@pytest.mark.parametrize("lock, why", [
    ({"run_id": "x-1-1", "pid": 5}, "the lock names no controller (None)"),
    ({"run_id": "x-1-1", "controller": "", "pid": 5}, "the lock names no controller ('')"),
    ({"run_id": "x-1-1", "controller": "HERE"}, "the lock names no pid on this controller"),
    ({"run_id": "x-1-1", "controller": "HERE", "pid": "12a"}, "the lock names pid '12a', not a process id on this"),
    ({"run_id": "x-1-1", "controller": "HERE", "pid": True}, "the lock names pid True, not a process id on this"),
    ({"run_id": "x-1-1", "controller": "HERE", "pid": -4}, "the lock names pid -4, not a process id on this"),
])
def test_a_lock_without_a_usable_pid_or_controller_has_an_unknown_holder(lock, why):
    here = run_lease.run_identity()["controller"]
    lock = dict(lock, controller=here) if lock.get("controller") == "HERE" else lock
    seen = run_lease.probe_holder(lock, None)
    assert seen["alive"] is None and seen["reason"].startswith(why), seen
