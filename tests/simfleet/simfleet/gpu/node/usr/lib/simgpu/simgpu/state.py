# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading and writing the node's GPU state file (JSON), safely under concurrency.

Writers take an exclusive ``flock`` on ``<state>.lock`` and replace the file by an atomic
rename, so readers never see a half-written file and two writers (nvidia-smi, NVML setters,
the boot unit, the fleet tool writing faults through the node's root mount) never lose each
other's changes when they use :func:`update_state`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

_CACHE: Dict[str, Tuple[Tuple[int, int, int], Dict[str, Any]]] = {}


def load_state(path: str) -> Dict[str, Any]:
    """Read the state file at ``path`` and return it as a dict.

    Raises ``FileNotFoundError`` when there is none and ``ValueError`` when it is not JSON.
    """
    with open(path, "r", encoding="utf-8") as handle:
        return json.load(handle)


def read_state_cached(path: str) -> Dict[str, Any]:
    """Like :func:`load_state`, but parse again only when the file changed (inode, mtime, size).

    The returned dict is shared between callers: treat it as read-only.
    """
    st = os.stat(path)
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    data = load_state(path)
    _CACHE[path] = (key, data)
    return data


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold the writers' lock of the state file at ``path`` (blocking)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _write_atomic(path: str, state: Dict[str, Any]) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".state.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(state, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _CACHE.pop(path, None)


def save_state(path: str, state: Dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temporary file + rename) under the writers' lock."""
    with locked(path):
        _write_atomic(path, state)


def update_state(path: str, mutate: Callable[[Dict[str, Any]], Optional[Any]]) -> Any:
    """Read-modify-write the state at ``path`` under the lock; return what ``mutate`` returns.

    ``mutate`` receives a private copy of the state and changes it in place. If it raises,
    nothing is written and the exception propagates.
    """
    with locked(path):
        state = load_state(path)
        result = mutate(state)
        _write_atomic(path, state)
        return result
