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
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
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
    """``<report_dir>/runs/<run_id>.lease`` (absolute); ``run_id`` must be a file name, not a path.

    :raises ValueError: when ``run_id`` is empty or holds a ``/`` or starts with a dot.
    """
    if not run_id or "/" in run_id or run_id.startswith("."):
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
    :raises OSError: when the lease cannot be written.
    """
    path = lease_path(report_dir, str(run["run_id"]))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return path  # its keeper holds it: already renewed
        body = json.dumps({"run_id": run["run_id"], "controller": run.get("controller"), "pid": run.get("pid"),
                           "awx_job_id": run.get("awx_job_id"), "renew_s": renew_s, "started_at": started_at},
                          sort_keys=True).encode("utf-8") + b"\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, body, 0)
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the flock before the keeper takes it
    subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-c", _KEEPER, path, str(int(run["pid"])), str(ticks or 0), str(renew_s), str(watch_s)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True, start_new_session=True, cwd="/")
    return path


def read(path: str, now: Optional[float] = None, stale_s: float = STALE_S) -> Dict[str, Any]:
    """Whether the run that holds a lease still runs, seen from here.

    :param path: the lease path a lock names (``lock["lease"]``).
    :param now: epoch seconds now (default: the clock).
    :param stale_s: seconds without renewal after which the run counts as gone.
    :returns: ``{"alive": True | False | None, "age_s": float | None, "lease": dict | None,
        "reason": str}``: ``None`` when the lease cannot be seen here (another controller's
        disk, removed, unreadable): its run's liveness is unknown.
    """
    now = time.time() if now is None else float(now)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, TypeError, ValueError) as exc:
        return {"alive": None, "age_s": None, "lease": None,
                "reason": "lease %s cannot be seen here (%s)" % (path, getattr(exc, "strerror", None) or exc)}
    try:
        info = os.fstat(fd)
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        content = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        content = None
    age = max(0.0, now - info.st_mtime)
    if age > stale_s:
        return {"alive": False, "age_s": age, "lease": content if isinstance(content, dict) else None,
                "reason": "lease %s not renewed for %d s (stale after %d s)" % (path, int(age), int(stale_s))}
    return {"alive": True, "age_s": age, "lease": content if isinstance(content, dict) else None,
            "reason": "lease %s renewed %d s ago" % (path, int(age))}


def probe_holder(controller: Optional[str], pid: Optional[int], lease: Optional[str]) -> Dict[str, Any]:
    """Whether the run named by a node's rollout lock still runs, seen from this controller.

    On the holder's own controller its ansible-playbook process answers
    (:func:`controller_run.pid_alive`); elsewhere (another controller, the next AWX job's
    container) its lease does (:func:`read`), when it can be seen here.

    :param controller: the lock's ``controller`` (hostname), or ``None``.
    :param pid: the lock's ``pid``, or ``None``.
    :param lease: the lock's ``lease`` path, or ``None``.
    :returns: ``{"alive": True | False | None, "reason": str}``; ``None``: unknown.
    """
    if controller and controller != run_identity()["controller"]:
        seen = read(lease) if lease else None
        if seen:
            return {"alive": seen["alive"], "reason": seen["reason"]}
        return {"alive": None, "reason": "the holder ran on another controller and names no lease"}
    alive = pid_alive(pid) if pid else False
    return {"alive": alive, "reason": "process %s on this controller %s" % (pid, "runs" if alive else "is gone")}
