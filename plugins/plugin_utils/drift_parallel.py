# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run one function over chunks of a list in forked worker processes (controller side, POSIX).

The drift report's cost is reading and decoding fact files and judging nodes, pure CPU work
that one Python process does on one core. Each worker is a ``fork`` of the caller, so it sees
the caller's state (open inventory, closures) without pickling it; only each chunk's result
comes back, pickled through a pipe. The caller works on the first chunk itself.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Callable, List, Sequence


class WorkerError(Exception):
    """A worker process failed; the message has its exception or exit status."""


def usable_cpus() -> int:
    """CPUs this process may run on (``os.sched_getaffinity``, else ``os.cpu_count()``), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def split(items: Sequence[Any], parts: int) -> List[List[Any]]:
    """``items`` cut into ``parts`` contiguous chunks of nearly equal size (none empty), order kept."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for number in range(parts):
        end = start + size + (1 if number < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


def map_forked(work: Callable[[List[Any]], Any], chunks: List[List[Any]]) -> List[Any]:
    """``[work(chunk) for chunk in chunks]``, chunks after the first in forked children.

    :param work: a function of one chunk returning a picklable value.
    :param chunks: at least one chunk.
    :returns: the results in chunk order.
    :raises WorkerError: when a child raised (its ``repr``) or died without a result.
    """
    children = []
    try:
        for chunk in chunks[1:]:
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: compute, send, leave without the parent's exit handlers
                os.close(read_end)
                code = 0
                try:
                    try:
                        data = pickle.dumps((True, work(chunk)), protocol=pickle.HIGHEST_PROTOCOL)
                    except BaseException as err:  # pylint: disable=broad-except
                        data = pickle.dumps((False, "%s: %s" % (type(err).__name__, err)))
                    with os.fdopen(write_end, "wb") as out:
                        out.write(data)
                except BaseException:  # pylint: disable=broad-except
                    code = 1
                os._exit(code)  # pylint: disable=protected-access
            os.close(write_end)
            children.append((pid, read_end))
        results = [work(chunks[0])]
    finally:
        received = []
        for pid, read_end in children:
            with os.fdopen(read_end, "rb") as source:
                data = source.read()
            _pid, status = os.waitpid(pid, 0)
            received.append((data, status))
    for data, status in received:
        if not data:
            raise WorkerError("a drift worker process ended without a result (wait status %d)" % status)
        ok, value = pickle.loads(data)
        if not ok:
            raise WorkerError("a drift worker process failed: %s" % value)
        results.append(value)
    return results
