# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rollout schedules: how Ansible's ``serial`` cuts a stage into sequential batches.

A rollout stage is one play; its ``serial`` keyword is a number, a percentage (``"5%"``) or a
list of them (``[1, "5%", "25%", "100%"]``). ansible-core turns it into batches in
``PlaybookExecutor._get_serialized_batches`` (``lib/ansible/executor/playbook_executor.py``)
with ``ansible.utils.helpers.pct_to_int``:

* a percentage is taken of the play's whole host count (not of the hosts left), truncated to an
  integer, and is at least 1 (``int(pct / 100.0 * hosts) or 1``);
* a plain value is ``int(value)``; a value of 0 or less takes every host left in one batch;
* the list is walked in order and its last value repeats until no host is left;
* an empty ``serial`` means one batch of every host.

:func:`serial_batches` reproduces that exactly, so that the number of sequential batches (the
length of a rollout in "waits") can be planned and documented without running a play. Pure
functions; Python 3.9 compatible.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Union

SerialValue = Union[int, str]

#: The waves' default ``serial``: one node, then 5 %, then 25 %, then everything left.
DEFAULT_SERIAL = (1, "5%", "25%", "100%")


def pct_to_int(value: SerialValue, num_items: int, min_value: int = 1) -> int:
    """Turn one ``serial`` value into a batch size, as ``ansible.utils.helpers.pct_to_int`` does.

    :param value: an ``int``, text of an integer (``"3"``), or a percentage text (``"25%"``; the
        number before ``%`` must be an integer, as in ansible-core).
    :param num_items: the play's host count (hosts matched by the play, after ``--limit``).
    :param min_value: the smallest size a percentage yields (ansible-core: 1).
    :returns: ``int(pct / 100.0 * num_items) or min_value`` for a percentage, else ``int(value)``.
    :raises ValueError: for text that is neither an integer nor an integer percentage
        (``"2.5%"``, ``"all"``), as ansible-core does.
    Source: ansible-core ``lib/ansible/utils/helpers.py`` ``pct_to_int``.
    """
    if isinstance(value, bool):
        raise ValueError("serial value must be an integer or a percentage, got %r" % (value,))
    if isinstance(value, str) and value.strip().endswith("%"):
        text = value.strip()[:-1]
        try:
            pct = int(text)
        except ValueError:
            raise ValueError("serial percentage must be an integer followed by %%, got %r" % (value,))
        return int((pct / 100.0) * num_items) or min_value
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("serial value must be an integer or a percentage, got %r" % (value,))


def normalize_serial(serial: Any) -> List[SerialValue]:
    """Return ``serial`` as a list, the way a play holds it (a scalar becomes a one-item list).

    :param serial: ``None``, an int, a text (``"5%"``) or a list of them.
    :returns: a new list; ``[]`` for ``None``.
    :raises ValueError: when an item is neither an int nor a text, or is invalid for
        :func:`pct_to_int`.
    """
    if serial is None:
        return []
    items = list(serial) if isinstance(serial, (list, tuple)) else [serial]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise ValueError("serial items must be integers or percentages, got %r" % (item,))
        pct_to_int(item, 1)
    return items


def serial_batches(serial: Any, host_count: int) -> List[int]:
    """Sizes of the sequential batches ansible-core runs for a play of ``host_count`` hosts.

    :param serial: the play's ``serial`` (see :func:`normalize_serial`).
    :param host_count: hosts the play matches (>= 0).
    :returns: batch sizes in order, summing to ``host_count``; ``[]`` for 0 hosts.
        Example: ``serial_batches([1, "5%", "25%", "100%"], 100)`` → ``[1, 5, 25, 69]``.
    :raises ValueError: for a negative ``host_count`` or an invalid ``serial``.
    Source: ansible-core ``PlaybookExecutor._get_serialized_batches``.
    """
    if host_count < 0:
        raise ValueError("host_count must be >= 0, got %r" % (host_count,))
    values = normalize_serial(serial) or [-1]
    left = int(host_count)
    batches = []  # type: List[int]
    item = 0
    while left > 0:
        size = pct_to_int(values[item], host_count)
        if size <= 0:
            batches.append(left)
            break
        take = min(size, left)
        batches.append(take)
        left -= take
        item = min(item + 1, len(values) - 1)
    return batches


def batch_count(serial: Any, host_count: int) -> int:
    """Number of sequential batches for ``host_count`` hosts (``len(serial_batches(...))``)."""
    return len(serial_batches(serial, host_count))


def plan_rollout(stages: Iterable[Dict[str, Any]], node_minutes: Optional[float] = None,
                 gate_minutes: Optional[float] = None) -> Dict[str, Any]:
    """Plan a staged rollout: batches per stage, sequential batches in all, gates between stages.

    :param stages: in order, ``{"name": str, "hosts": int, "serial": serial}``; a stage with 0
        hosts has no batches and no gate after it.
    :param node_minutes: minutes one node's transaction takes (drain, install, reboot, verify);
        when given, ``minutes`` estimates the wall time (batches run one after the other, the
        nodes of a batch in parallel, so a batch lasts about one transaction).
    :param gate_minutes: minutes each gate between two non-empty stages waits (soak time).
    :returns: ``{"stages": [{"name", "hosts", "serial", "batches": [int], "batch_count"}],
        "hosts": int, "batch_count": int (sum over stages), "gates": int (non-empty stages - 1),
        "minutes": float | None}``.
    :raises ValueError: for an invalid ``serial`` or a negative host count.
    """
    planned = []
    hosts = 0
    total = 0
    for stage in stages:
        count = int(stage.get("hosts") or 0)
        batches = serial_batches(stage.get("serial"), count)
        planned.append({
            "name": stage.get("name"),
            "hosts": count,
            "serial": normalize_serial(stage.get("serial")),
            "batches": batches,
            "batch_count": len(batches),
        })
        hosts += count
        total += len(batches)
    gates = max(0, len([stage for stage in planned if stage["hosts"]]) - 1)
    minutes = None
    if node_minutes is not None:
        minutes = total * float(node_minutes) + gates * float(gate_minutes or 0)
    return {"stages": planned, "hosts": hosts, "batch_count": total, "gates": gates, "minutes": minutes}
