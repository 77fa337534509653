# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a rollout left on a node, as facts: its flag and its drain record.

The ``node_upgrade`` role flags a node it could not bring to the target or back
(``/etc/ansible/facts.d/gpufleet_rollout.fact``: ``{flagged, rollout_id, stage, time, reason,
failed_version, rollback_version, rollback_installed, rollback_verified, drained}``, docs/rollout.md)
and records that it drained a node before it drains it (``drain.json`` in its state directory:
``{backend, rollout_id, run_id, reason, drained_at, first_drained_by}``). ``gpu_facts`` reads both
(:func:`node_lock.read_state`), so that every consumer of the facts, the drift report first, knows
a node is out of service because of a rollout and why. Compatible with Python 3.7.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

#: Flag file the node_upgrade role writes (its ``__node_upgrade_flag_file``).
FLAG_FILE = "/etc/ansible/facts.d/gpufleet_rollout.fact"

#: The node_upgrade role's default state directory (``node_upgrade_state_dir``); ``drain.json`` is in it.
STATE_DIR = "/var/lib/gpufleet/rollout"


def not_read() -> Dict[str, Any]:
    """The ``rollout`` section when the node's files were not read (a capture bundle): all ``None``."""
    return {"flagged": None, "reason": None, "rollout_id": None, "stage": None, "time": None,
            "rollback_version": None, "rollback_verified": None, "drained": None, "drained_by": None,
            "drained_at": None, "unreadable": []}


def rollout_marks(flag: Optional[Mapping[str, Any]], drain: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The ``rollout`` section of the facts from the node's flag and drain record.

    :param flag: :func:`node_lock.read_state` of :data:`FLAG_FILE` (``{exists, content,
        unreadable, identity}``), or ``None`` when it was not read.
    :param drain: the same for ``drain.json``, or ``None``.
    :returns: ``{"flagged": bool or None (not read), "reason", "rollout_id", "stage", "time",
        "rollback_version", "rollback_verified" (the flag's words, ``None`` when absent),
        "drained": bool or None (a rollout of this collection drained the node: its drain record
        exists), "drained_by" (the record's ``rollout_id``), "drained_at", "unreadable": [why a
        file that exists could not be used]}``. A flag file that exists but cannot be parsed
        counts as flagged (the role refuses such a node too), with its problem as the reason.
    :raises: nothing.
    """
    out = not_read()
    if flag is not None:
        content = flag.get("content")
        if flag.get("unreadable"):
            out["flagged"] = True
            out["reason"] = "%s; inspect and remove it" % flag["unreadable"]
            out["unreadable"].append(flag["unreadable"])
        elif isinstance(content, Mapping):
            out["flagged"] = bool(content.get("flagged", True))
            for key in ("reason", "rollout_id", "stage", "time", "rollback_version", "rollback_verified"):
                out[key] = content.get(key)
        else:
            out["flagged"] = False
    if drain is not None:
        content = drain.get("content")
        if drain.get("unreadable"):
            out["drained"] = True
            out["unreadable"].append(drain["unreadable"])
        elif isinstance(content, Mapping):
            out["drained"] = True
            out["drained_by"] = content.get("rollout_id")
            out["drained_at"] = content.get("drained_at")
        else:
            out["drained"] = False
    return out
