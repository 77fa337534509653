# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A run's lease: a file in the report directory that a running rollout renews, read by the next run.

A node's rollout lock names the run that holds it. On one controller the holder's liveness is
seen directly (its ansible-playbook process, :mod:`controller_run`). An AWX or AAP job runs in
a container whose hostname and process ids are new in every job, so the next job cannot see
the last one's process. What it can see is the report directory, which such jobs keep on a
persistent volume: there each run keeps ``runs/<run_id>.lease``, renewed every
:data:`RENEW_S` seconds (its modification time) by a small keeper process while the run's
ansible-playbook process lives. A lease not renewed for :data:`STALE_S` seconds belongs to a
run that is gone (killed, cancelled, its container removed); a renewed one to a run that
still runs, however long it has held its nodes (a drain waiting for a job of days).

The lease file holds ``{"run_id", "controller", "pid", "awx_job_id", "renew_s", "started_at"}``
(``awx_job_id``: AWX's ``JOB_ID`` environment variable, set for every job's ansible-playbook,
``awx/main/tasks`` ``RunJob.build_env``; ``None`` elsewhere).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils import state_file
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_run import pid_alive, run_identity

#: Seconds between two renewals of a lease by its keeper.
RENEW_S = 60.0
#: Seconds without renewal after which a lease's run counts as gone (five renewals missed).
STALE_S = 300.0
#: Seconds between two looks of the keeper at the run's process.
WATCH_S = 5.0

# The keeper: holds an exclusive flock on the lease file (a second keeper of the same run exits),
# renews its modification time while the run's process (pid and start time) lives, then exits
# and leaves the file as it was last renewed.
_KEEPER = r"""
import fcntl, os, sys, time
path, pid, ticks, renew, watch = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(0)
def alive():
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    return ticks == "0" or (len(fields) > 19 and fields[19] == ticks)
last = 0.0
while alive():
    now = time.time()
    if now - last >= renew:
        try:
            os.utime(fd)
        except OSError:
            pass
        last = now
    time.sleep(watch)
"""


def lease_path(report_dir: str, run_id: str) -> str:
    """``<report_dir>/runs/<run_id>.lease`` (absolute); ``run_id`` must be a plain file name.

    :raises ValueError: when ``run_id`` is not text, is empty, or is not a plain name (the one
        file-name rule, ``state_file.file_name``: letters, digits, ``.``, ``_``, ``-``, not first).
    """
    if not isinstance(run_id, str) or not run_id or state_file.file_name(run_id) != run_id:
        raise ValueError("a run id that cannot name a lease file: %r" % (run_id,))
    return os.path.join(os.path.abspath(report_dir), "runs", run_id + ".lease")


def start(report_dir: str, run: Mapping[str, Any], ticks: Optional[int], started_at: str,
          renew_s: float = RENEW_S, watch_s: float = WATCH_S) -> str:
    """Write the run's lease and start its keeper, unless a keeper already renews it.

    :param report_dir: the rollout's report directory (controller side).
    :param run: :func:`controller_run.run_identity`'s ``{"run_id", "controller", "pid", "awx_job_id"}``.
    :param ticks: the run's process start time in clock ticks (``/proc/<pid>/stat`` field 22), so
        that a later process with the same pid does not keep the lease; ``None``: pid only.
    :param started_at: ISO time the run started, kept in the lease.
    :returns: the lease path.
    :raises OSError: when the lease cannot be written (``state_file.UnsafeDirectory``: the report
        directory or its ``runs/`` is writable by others).
    """
    path = lease_path(report_dir, str(run["run_id"]))
    state_file.private_dir(os.path.abspath(report_dir))
    state_file.private_dir(os.path.dirname(path))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return path  # its keeper holds it: already renewed
        body = json.dumps({"run_id": run["run_id"], "controller": run.get("controller"), "pid": run.get("pid"),
                           "awx_job_id": run.get("awx_job_id"), "renew_s": renew_s, "started_at": started_at},
                          sort_keys=True).encode("utf-8") + b"\n"
        # No keeper holds it: replaced whole (the keeper opens the new file).
        state_file.write_atomic(path, body, 0o600)
    finally:
        os.close(fd)  # releases the flock before the keeper takes it
    subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-c", _KEEPER, path, str(int(run["pid"])), str(ticks or 0), str(renew_s), str(watch_s)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True, start_new_session=True, cwd="/")
    return path


#: Seconds a lease's modification time may lie ahead of this controller's clock before it counts
#: as unknown (two controllers' clocks, NTP-synchronised, differ by far less).
FUTURE_S = 5.0
#: Bytes of a lease read at most (one is about 200).
MAX_LEASE_BYTES = 4096


def read(path: str, now: Optional[float] = None, stale_s: float = STALE_S,
         run_id: Optional[str] = None) -> Dict[str, Any]:
    """Whether the run that holds a lease still runs, seen from here.

    :param path: the lease path (:func:`lease_path` of the lock's run id under this controller's
        own report directory, never a path a node gives).
    :param now: epoch seconds now (default: the clock).
    :param stale_s: seconds without renewal after which the run counts as gone.
    :param run_id: the run the lock names: a lease that names another run is unknown.
    :returns: ``{"alive": True | False | None, "age_s": float | None, "lease": dict | None,
        "reason": str}``: ``None`` (unknown) when the lease cannot be seen here (another
        controller's disk, removed), cannot be read (``state_file.read``: a link, a directory, not
        JSON), names another run than the lock, or was modified more than :data:`FUTURE_S`
        seconds in the future (clock skew). Never raises.
    """
    now = time.time() if now is None else float(now)
    found = state_file.read(path, max_bytes=MAX_LEASE_BYTES)
    content = found["content"]
    if not found["exists"]:
        return _seen(None, None, None, "lease %s cannot be seen here (absent)" % path)
    if found["unreadable"] or found["mtime"] is None:
        return _seen(None, None, None, "%s: the run's liveness is unknown" % found["unreadable"])
    if run_id is not None and content.get("run_id") != run_id:
        return _seen(None, None, content, "lease %s names run %r, not the lock's run %s: the holder's liveness is "
                                          "unknown" % (path, content.get("run_id"), run_id))
    age = now - found["mtime"]
    if age < -FUTURE_S:
        return _seen(None, None, content, "lease %s was modified %d s in the future of this controller's clock "
                                          "(clock skew between controllers?): the holder's liveness is unknown"
                     % (path, int(-age)))
    age = max(0.0, age)
    if age > stale_s:
        return _seen(False, age, content, "lease %s not renewed for %d s (stale after %d s)" % (
            path, int(age), int(stale_s)))
    return _seen(True, age, content, "lease %s renewed %d s ago" % (path, int(age)))


def _seen(alive: Optional[bool], age: Optional[float], lease: Any, reason: str) -> Dict[str, Any]:
    return {"alive": alive, "age_s": age, "lease": lease if isinstance(lease, dict) else None, "reason": reason}


def _pid(value: Any) -> Optional[int]:
    """A process id from a lock (an int, or digits as text), else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 < value < 2 ** 22 else None
    if isinstance(value, str) and value.isdigit() and len(value) <= 7:
        return _pid(int(value))
    return None


def probe_holder(lock: Mapping[str, Any], runs_dir: Optional[str], now: Optional[float] = None,
                 proc_root: str = "/proc") -> Dict[str, Any]:
    """Whether the run named by a node's rollout lock still runs, seen from this controller.

    A node is not trusted by the controller (docs/security.md): nothing the lock says picks a
    controller path. On the holder's own controller its ansible-playbook process answers
    (:func:`controller_run.pid_alive`); elsewhere (another controller, the next AWX job's
    container) the lease of the lock's ``run_id`` in this controller's own ``runs/`` directory
    does (:func:`read`), when it is there. The ``lease`` path a lock names is never opened.

    :param lock: the node's lock (``controller``, ``pid``, ``run_id``; any types).
    :param runs_dir: this run's own ``<report_dir>/runs`` (the directory of its own lease), or
        ``None`` when it has none.
    :returns: ``{"alive": True | False | None, "reason": str}``; ``None``: unknown, and the
        reason says why (no controller, no pid or one that is not a process id, no run id, no
        lease here, a lease of another run or from the future).
    """
    lock = lock if isinstance(lock, Mapping) else {}
    controller, run_id = lock.get("controller"), lock.get("run_id")
    if not isinstance(controller, str) or not controller:
        return {"alive": None, "reason": "the lock names no controller (%r): the holder's liveness is unknown"
                                         % (controller,)}
    if controller != run_identity()["controller"]:
        try:
            name = lease_path("/", run_id)
        except ValueError:
            return {"alive": None, "reason": "the holder ran on controller %s and its run id %r names no lease: its "
                                             "liveness is unknown" % (controller, run_id)}
        if not runs_dir:
            return {"alive": None, "reason": "the holder ran on controller %s and this run keeps no lease directory "
                                             "to look in: its liveness is unknown" % controller}
        seen = read(os.path.join(runs_dir, os.path.basename(name)), now, run_id=run_id)
        return {"alive": seen["alive"], "reason": seen["reason"]}
    pid = _pid(lock.get("pid"))
    if pid is None:
        return {"alive": None, "reason": "the lock names %s on this controller: the holder's liveness is unknown" % (
            "no pid" if lock.get("pid") in (None, "") else "pid %r, not a process id" % (lock.get("pid"),))}
    alive = pid_alive(pid, proc_root)
    return {"alive": alive, "reason": "process %d on this controller %s" % (pid, "runs" if alive else "is gone")}
