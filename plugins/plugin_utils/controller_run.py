# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which ansible-playbook run this is, and whether another run on this controller still runs."""

from __future__ import annotations

import os
import socket
from typing import Optional


def process_start_ticks(pid, proc_root="/proc"):
    """Start time of a process in clock ticks since boot (``/proc/<pid>/stat`` field 22), or ``None``.

    Source: proc(5), ``/proc/[pid]/stat`` ``starttime``.
    """
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "r") as handle:
            text = handle.read()
    except (IOError, OSError):
        return None
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def run_identity(proc_root="/proc"):
    """Identify this ansible-playbook run: the same in every worker of one run, new in the next.

    Workers are forked from the ansible-playbook process, so the parent pid is the run's pid;
    with the process start time it makes an id that pid reuse cannot repeat. Under AWX / AAP the
    job's id comes with it (the ``JOB_ID`` environment variable AWX sets for the job's
    ansible-playbook, ``awx/main/tasks`` ``RunJob.build_env``), for people and reports to name
    the holder by.
    :returns: ``{"run_id", "controller", "pid", "ticks" (the process start time, clock ticks, or
        ``None``), "awx_job_id" (str or ``None``)}``.
    """
    pid = os.getppid()
    controller = socket.gethostname()
    ticks = process_start_ticks(pid, proc_root)
    return {"run_id": "%s-%d-%s" % (controller, pid, ticks or 0), "controller": controller, "pid": pid,
            "ticks": ticks, "awx_job_id": os.environ.get("JOB_ID") or None}


def pid_alive(pid, proc_root="/proc"):
    """Whether ``pid`` is a running ansible process on this controller (``/proc/<pid>/cmdline``)."""
    try:
        with open(os.path.join(proc_root, str(int(pid)), "cmdline"), "rb") as handle:
            cmdline = handle.read()
    except (IOError, OSError, ValueError, TypeError):
        return False
    return b"ansible" in cmdline


def run_alive(run_id: str, proc_root: str = "/proc") -> Optional[bool]:
    """Whether the run named ``run_id`` (:func:`run_identity`: ``<controller>-<pid>-<start ticks>``) still runs.

    :returns: ``True`` / ``False`` for a run of this controller (its process runs and started at the
        same tick: pid reuse does not fool it), ``None`` for another controller's run or an id of
        another shape (its liveness cannot be seen from here).
    """
    parts = str(run_id or "").rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return None
    pid = int(parts[1])
    if not pid_alive(pid, proc_root):
        return False
    ticks = process_start_ticks(pid, proc_root)
    return parts[2] == "0" or ticks is None or str(ticks) == parts[2]
