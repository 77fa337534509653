# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's rollout lock and its state files, read and written atomically on the node.

The lock (``/var/lib/gpufleet/rollout/lock.json`` by default) says which rollout run holds
the node: ``{"rollout_id", "run_id", "controller", "pid", "acquired_at"}``. The controller
reads it, decides whether it may take it (``rollout_verdict.rollout_lock``: free, its own, a
dead or stale holder, or broken on request) and then takes it with :func:`acquire`, which
compares and swaps: under an exclusive ``flock`` on the state directory it takes the lock
only when the file is still what the decision was made on (:func:`identity`), and writes it
through a temporary file and ``rename`` (atomic on POSIX file systems). Two controllers that
both read a free lock cannot both take it: the second finds the first one's lock.

A state file that exists but is not a JSON object (cut short, overwritten, binary) is not an
error here: :func:`read_state` says why it cannot be read, and the caller refuses the node
with that reason unless told to break the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any, Dict, Iterator, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils import state_file

#: Bytes of a state file read at most (:data:`state_file.MAX_STATE_BYTES`).
MAX_STATE_BYTES = state_file.MAX_STATE_BYTES


def read_state(path: str) -> Dict[str, Any]:
    """Read one rollout state file (lock, flag, snapshot, drain record) without trusting its content.

    :param path: the file's path on the node.
    :returns: ``{"exists": bool, "content": dict | None, "unreadable": str | None,
        "identity": str | None}``: ``content`` is the parsed JSON object; ``unreadable`` is
        ``state_file``'s ``unreadable: <path>: <why>`` for a file that exists and cannot be used
        (a symbolic link, a directory, not a regular file, cannot be opened, too large, not
        UTF-8, not JSON, a NaN or Infinity, nested too deep, JSON but not an object);
        ``identity`` is :func:`identity` of the file's bytes (``symlink``, ``directory`` or
        ``special`` for what is not a regular file). Never raises.
    """
    found = state_file.read(path)
    return _state(found["exists"], found["content"], found["unreadable"], found["identity"])


def read_states(paths: Mapping[str, str]) -> Dict[str, Dict[str, Any]]:
    """Read several rollout state files at once, each as :func:`read_state` does.

    :param paths: name → path on the node, e.g. ``{"lock": "/var/lib/gpufleet/rollout/lock.json"}``.
    :returns: name → :func:`read_state`'s result. A file that cannot even be opened (permission
        denied, an I/O error) is unreadable with the reason, not an error: one file never fails
        the others.
    """
    return dict((name, read_state(path)) for name, path in paths.items())


def read_boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> Optional[str]:
    """The node's boot id (a UUID, new at every boot; Linux ``/proc/sys/kernel/random/boot_id``), or ``None``."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(128).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text or None


def parse_state(raw: bytes, path: str = "the file") -> Dict[str, Any]:
    """Parse the bytes of a state file: :func:`read_state`'s result for a file that exists."""
    ident = identity(raw)
    try:
        value = state_file.loads(raw, path)
    except state_file.Unreadable as exc:
        return _state(True, None, exc.text(), ident)
    return _state(True, value, None, ident)


def unreadable_state(reason: str) -> Dict[str, Any]:
    """:func:`read_state`'s result for a file that exists but could not be read at all (``reason``)."""
    return _state(True, None, reason, None)


def _state(exists: bool, content: Optional[Dict[str, Any]], unreadable: Optional[str],
           ident: Optional[str]) -> Dict[str, Any]:
    return {"exists": exists, "content": content, "unreadable": unreadable, "identity": ident}


def identity(raw: Optional[bytes]) -> Optional[str]:
    """What the lock file is, for compare-and-swap: ``None`` (absent) or ``sha256:<hex>`` of its bytes."""
    return state_file.identity(raw)


@contextlib.contextmanager
def _directory_locked(directory: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the state directory (created 0700 when missing; one that others
    can write is refused, :func:`state_file.private_dir`)."""
    state_file.private_dir(directory)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _current_identity(path: str) -> Optional[str]:
    return read_state(path)["identity"]


def acquire(path: str, lock: Mapping[str, Any], expect: Optional[str]) -> Dict[str, Any]:
    """Take the lock if the file is still what the decision was made on.

    :param path: the lock file; its directory is created (0700) and ``flock``-ed meanwhile.
    :param lock: the lock to write (``rollout_verdict.rollout_lock``'s ``lock``).
    :param expect: :func:`identity` of the lock file when it was read (``None``: it was absent).
    :returns: ``{"acquired": bool, "changed": bool, "found": the lock now there (dict, or None
        when absent or unreadable), "reason": str | None}``. ``acquired`` is false when
        another writer changed the file since it was read; nothing is written then.
    :raises OSError: when the directory or file cannot be written
        (``state_file.UnsafeDirectory`` when others can write the directory).
    """
    directory = os.path.dirname(path) or "."
    with _directory_locked(directory):
        now = _current_identity(path)
        if now != expect:
            found = read_state(path)
            holder = found["content"] or {}
            return {"acquired": False, "changed": False, "found": found["content"],
                    "reason": "the rollout lock changed between reading and taking it: now held by rollout %s "
                              "(run %s, controller %s, pid %s); another rollout took the node first" % (
                                  holder.get("rollout_id"), holder.get("run_id"), holder.get("controller"),
                                  holder.get("pid")) if holder else
                              "the rollout lock changed between reading and taking it (%s)" % (
                                  found["unreadable"] or "now absent")}
        data = (json.dumps(dict(lock), indent=2, sort_keys=True) + "\n").encode("utf-8")
        if now is not None and now == identity(data):
            return {"acquired": True, "changed": False, "found": dict(lock), "reason": None}
        state_file.write_atomic(path, data, 0o600)
        return {"acquired": True, "changed": True, "found": dict(lock), "reason": None}


def release(path: str, run_id: str, force: bool = False) -> Dict[str, Any]:
    """Remove the lock if this run holds it.

    :param run_id: the run that took it; a lock of another run is left in place (it is theirs).
    :param force: remove it whatever it holds (an operator's ``lock_break``).
    :returns: ``{"released": bool, "changed": bool, "found": dict | None, "reason": str | None}``.
    """
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        return {"released": True, "changed": False, "found": None, "reason": None}
    with _directory_locked(directory):
        found = read_state(path)
        if not found["exists"]:
            return {"released": True, "changed": False, "found": None, "reason": None}
        content = found["content"] or {}
        if not force and content.get("run_id") != run_id:
            return {"released": False, "changed": False, "found": found["content"],
                    "reason": "the lock is not this run's (%s): left in place" % (
                        "run %s" % content.get("run_id") if content else found["unreadable"])}
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)
        return {"released": True, "changed": True, "found": found["content"], "reason": None}
