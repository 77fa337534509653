# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's state in its scheduler, read on the controller before a drain and after it.

Who drained a node decides whether a rollout may return it to service: a node drained (or
cordoned) before the rollout touched it stays so, and is not upgraded unless asked; a node the
rollout drained is returned to service by it once good again, also when a later run (a rollback)
gets it there. So ownership is recorded when the drain is made (``drain.json`` on the node), and
the scheduler's state is read only to see whether someone else drained it.

Sources: Slurm 22.05 ``scontrol show node -o`` (one line of ``Key=Value`` fields; ``State`` is
the base state with ``+``-joined flags such as ``DRAIN``; ``Reason`` is last and may hold
spaces: ``Reason=text [user@time]``); Kubernetes ``kubectl get node -o
jsonpath={.spec.unschedulable}`` (``true`` when cordoned).

How long a node's drain will take is read from Slurm too, for the rollout's longest-drain-first
order: ``squeue --noheader --states=RUNNING,COMPLETING --format=%N|%L`` (squeue(1), Slurm
22.05: ``%N`` the job's nodes as a hostlist expression such as ``gpu[01-03,07],login1``;
``%L`` the time left before the job's time limit, ``days-hours:minutes:seconds`` with the
leading fields left out when zero, or ``NOT_SET`` / ``UNLIMITED``).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.-]*)=(\S*)")


def parse_slurm_show_node(text: str) -> Dict[str, Any]:
    """Parse ``scontrol show node -o NODE``.

    :param text: the command's output: one line (the first non-empty line is read).
    :returns: ``{"name", "state" (base state, e.g. ``IDLE``), "flags" ([``DRAIN``, ...]),
        "drained" (no job left: ``DRAIN`` on an idle node, or ``DOWN``), "draining" (``DRAIN``
        while jobs run), "out_of_service" (``DRAIN``, ``DOWN`` or ``FAIL``), "reason" (text
        without the ``[user@time]`` suffix, or None), "reason_by" (``user@time`` or None),
        "gres", "partitions" ([names])}``.
    :raises ValueError: when the text has no ``NodeName=`` field (not a node's line).
    """
    line = next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "")
    head, sep, reason = line.partition(" Reason=")
    fields = dict(_FIELD.findall(head))
    if "NodeName" not in fields:
        raise ValueError("not a line of scontrol show node -o: %r" % line[:200])
    parts = [p for p in (fields.get("State") or "").upper().split("+") if p]
    base = parts[0] if parts else None
    flags = parts[1:]
    reason_text, reason_by = None, None
    if sep and reason.strip() and reason.strip() != "(null)":
        match = re.match(r"^(.*?)\s*\[([^\]]*)\]\s*$", reason.strip())
        reason_text, reason_by = (match.group(1), match.group(2)) if match else (reason.strip(), None)
    drain = "DRAIN" in flags or base in ("DRAINED", "DRAINING")
    busy = base in ("ALLOCATED", "MIXED", "COMPLETING", "DRAINING") or "COMPLETING" in flags
    down = base in ("DOWN", "FAIL") or "FAIL" in flags
    return {"name": fields["NodeName"], "state": base, "flags": flags,
            "drained": (drain and not busy) or down, "draining": drain and busy,
            "out_of_service": drain or down, "reason": reason_text, "reason_by": reason_by,
            "gres": fields.get("Gres") if fields.get("Gres") not in (None, "(null)") else None,
            "partitions": [p for p in (fields.get("Partitions") or "").split(",") if p]}


def drain_state(backend: str, output: Optional[str]) -> Dict[str, Any]:
    """Whether the node is out of service in its scheduler now, from the backend's read command.

    :param backend: ``slurm``, ``slurm_reboot`` (read as ``slurm``: the same node state),
        ``kubernetes``, ``command`` or ``none``.
    :param output: ``scontrol show node -o NAME`` (slurm, slurm_reboot) or the ``unschedulable`` jsonpath
        (kubernetes); ignored for the others.
    :returns: ``{"backend", "known": bool, "out_of_service": bool | None, "draining": bool,
        "reason": str | None}``; ``known`` is false for ``command`` and ``none``, which cannot
        be asked.
    :raises ValueError: for an unknown backend or output Slurm does not write.
    """
    if backend in ("slurm", "slurm_reboot"):
        node = parse_slurm_show_node(output or "")
        return {"backend": backend, "known": True, "out_of_service": node["out_of_service"],
                "draining": node["draining"], "reason": node["reason"], "state": "+".join([node["state"] or ""] + node["flags"])}
    if backend == "kubernetes":
        cordoned = str(output or "").strip().lower() == "true"
        return {"backend": backend, "known": True, "out_of_service": cordoned, "draining": False,
                "reason": "cordoned" if cordoned else None, "state": "cordoned" if cordoned else "schedulable"}
    if backend in ("command", "none"):
        return {"backend": backend, "known": False, "out_of_service": None, "draining": False, "reason": None,
                "state": None}
    raise ValueError("unknown drain backend %r (slurm, slurm_reboot, kubernetes, command, none)" % backend)


def drained_by_others(state: Any, record: Any) -> bool:
    """Whether someone other than this collection's rollouts took the node out of service.

    :param state: :func:`drain_state`.
    :param record: the node's ``drain.json`` (``{"rollout_id", "run_id", "backend", "reason",
        "drained_at"}``) written when a rollout drained it, or ``{}``/``None``.
    :returns: true when the scheduler shows the node out of service and no drain record of a
        rollout of this collection is on the node.
    """
    if not isinstance(state, dict) or not state.get("out_of_service"):
        return False
    return not (isinstance(record, dict) and record.get("rollout_id"))


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
#: A hostlist expression can name a large range; more names than this in one is refused.
MAX_HOSTLIST = 100000


def expand_hostlist(text: str) -> List[str]:
    """Expand a Slurm hostlist expression: ``"gpu[01-03,07],login1"`` → ``["gpu01", "gpu02",
    "gpu03", "gpu07", "login1"]``.

    Brackets hold comma-separated numbers and ``a-b`` ranges; a range keeps the width of its
    first number (``[08-10]`` → ``08, 09, 10``). Several bracket groups in one name multiply.
    :raises ValueError: for unbalanced brackets, a range that is not ``a-b`` with ``a <= b``, or
        more than :data:`MAX_HOSTLIST` names.
    """
    names = []  # type: List[str]
    for item in _split_top(str(text or "").strip()):
        expanded = [""]
        rest = item
        while rest:
            head, sep, tail = rest.partition("[")
            if "]" in head:
                raise ValueError("unbalanced ] in hostlist %r" % text)
            if not sep:
                expanded = [e + head for e in expanded]
                break
            inner, close, rest = tail.partition("]")
            if not close or "[" in inner:
                raise ValueError("unbalanced [ in hostlist %r" % text)
            values = []
            for part in inner.split(","):
                match = _RANGE.match(part.strip())
                if not match:
                    raise ValueError("bad range %r in hostlist %r" % (part, text))
                low, high = match.group(1), match.group(2) or match.group(1)
                if int(high) < int(low):
                    raise ValueError("bad range %r in hostlist %r" % (part, text))
                if int(high) - int(low) >= MAX_HOSTLIST:
                    raise ValueError("hostlist %r names more than %d nodes" % (text, MAX_HOSTLIST))
                values.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
            expanded = [e + head + v for e in expanded for v in values]
            if len(expanded) > MAX_HOSTLIST:
                raise ValueError("hostlist %r names more than %d nodes" % (text, MAX_HOSTLIST))
        names.extend(e for e in expanded if e)
        if len(names) > MAX_HOSTLIST:
            raise ValueError("hostlist %r names more than %d nodes" % (text, MAX_HOSTLIST))
    return names


def _split_top(text: str) -> List[str]:
    """Split at commas outside brackets."""
    out, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            out.append("".join(current))
            current = []
        else:
            current.append(char)
    out.append("".join(current))
    return [item.strip() for item in out if item.strip()]


def slurm_time_s(text: str) -> Optional[float]:
    """Seconds in a Slurm duration (``"1-02:03:04"``, ``"2:03:04"``, ``"3:04"``, ``"45"``), or ``None``
    for ``NOT_SET``, ``UNLIMITED``, ``INVALID`` and anything else that is not a duration."""
    value = str(text or "").strip()
    match = re.match(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$", value)
    if not match:
        return None
    days = int(match.group(1) or 0)
    fields = [int(g) for g in match.groups()[1:] if g is not None]
    if match.group(1) is not None:
        # days-hours[:minutes[:seconds]]
        fields += [0] * (3 - len(fields))
        hours, minutes, seconds = fields
    elif len(fields) == 3:
        hours, minutes, seconds = fields
    elif len(fields) == 2:
        hours, (minutes, seconds) = 0, fields
    else:
        hours, minutes, seconds = 0, fields[0], 0
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def slurm_drain_estimates(text: str) -> Dict[str, float]:
    """Per Slurm node, the seconds until its running jobs reach their time limit: how long its drain
    can take at most.

    :param text: ``squeue --noheader --states=RUNNING,COMPLETING --format=%N|%L`` output; a line
        that cannot be read, or a job without a time limit (``UNLIMITED``, ``NOT_SET``), gives
        no estimate for its nodes (their order is the inventory's).
    :returns: ``{slurm node name: seconds}``, the longest job per node.
    """
    out = {}  # type: Dict[str, float]
    unknown = set()
    for line in str(text or "").splitlines():
        nodes, sep, left = line.strip().rpartition("|")
        if not sep or not nodes:
            continue
        try:
            names = expand_hostlist(nodes)
        except ValueError:
            continue
        seconds = slurm_time_s(left)
        for name in names:
            if seconds is None:
                unknown.add(name)
            else:
                out[name] = max(out.get(name, 0.0), seconds)
    for name in unknown:
        out.pop(name, None)
    return out
