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
import errno
import fcntl
import hashlib
import json
import os
import stat
from typing import Any, Dict, Iterator, Mapping, Optional

#: Bytes of a state file read at most. A lock or flag is a few hundred bytes; the largest is the
#: snapshot: the facts document (about 26 kB for 8 GPUs, 77 kB after a storm of 100,000 Xid lines,
#: docs/facts.md) and the GPU trace before the update (about 10 kB for 8 GPUs, 3 s). A file larger
#: than this is not ours.
MAX_STATE_BYTES = 1048576


def read_state(path: str) -> Dict[str, Any]:
    """Read one rollout state file (lock, flag, snapshot) without trusting its content.

    :param path: the file's path on the node.
    :returns: ``{"exists": bool, "content": dict | None, "unreadable": str | None,
        "identity": str | None}``: ``content`` is the parsed JSON object; ``unreadable`` says
        why a file that exists could not be used (not a regular file, too large, not UTF-8,
        not JSON, JSON but not an object); ``identity`` is :func:`identity` of the file.
    :raises OSError: only for errors other than a missing file (e.g. permission denied).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return _state(False, None, None, None)
        if exc.errno == errno.ELOOP:
            return _state(True, None, "%s is a symbolic link" % path, "symlink")
        if exc.errno == errno.EISDIR:
            return _state(True, None, "%s is a directory" % path, "directory")
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            return _state(True, None, "%s is a directory" % path, "directory")
        if not stat.S_ISREG(info.st_mode):
            return _state(True, None, "%s is not a regular file" % path, "special")
        raw = os.read(fd, MAX_STATE_BYTES + 1)
    finally:
        os.close(fd)
    return parse_state(raw, path)


def read_states(paths: Mapping[str, str]) -> Dict[str, Dict[str, Any]]:
    """Read several rollout state files at once, each as :func:`read_state` does.

    :param paths: name → path on the node, e.g. ``{"lock": "/var/lib/gpufleet/rollout/lock.json"}``.
    :returns: name → :func:`read_state`'s result. A file that cannot even be opened (permission
        denied, an I/O error) is unreadable with the reason, not an error: the caller decides.
    """
    out = {}  # type: Dict[str, Dict[str, Any]]
    for name, path in paths.items():
        try:
            out[name] = read_state(path)
        except OSError as exc:
            out[name] = unreadable_state("%s cannot be read (%s)" % (path, exc.strerror or exc))
    return out


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
    if len(raw) > MAX_STATE_BYTES:
        return _state(True, None, "%s is larger than %d bytes" % (path, MAX_STATE_BYTES), ident)
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return _state(True, None, "%s is not UTF-8 text" % path, ident)
    except ValueError as exc:
        return _state(True, None, "%s is not JSON (%s)" % (path, exc), ident)
    if not isinstance(value, dict):
        return _state(True, None, "%s holds a JSON %s, not an object" % (path, type(value).__name__), ident)
    return _state(True, value, None, ident)


def unreadable_state(reason: str) -> Dict[str, Any]:
    """:func:`read_state`'s result for a file that exists but could not be read at all (``reason``)."""
    return _state(True, None, reason, None)


def _state(exists: bool, content: Optional[Dict[str, Any]], unreadable: Optional[str],
           ident: Optional[str]) -> Dict[str, Any]:
    return {"exists": exists, "content": content, "unreadable": unreadable, "identity": ident}


def identity(raw: Optional[bytes]) -> Optional[str]:
    """What the lock file is, for compare-and-swap: ``None`` (absent) or ``sha256:<hex>`` of its bytes."""
    if raw is None:
        return None
    return "sha256:" + hashlib.sha256(raw).hexdigest()


@contextlib.contextmanager
def _directory_locked(directory: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the state directory (created 0700 when missing)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
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
    :raises OSError: when the directory or file cannot be written.
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
        temporary = "%s.%d.tmp" % (path, os.getpid())
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        os.rename(temporary, path)
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
