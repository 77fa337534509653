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
from typing import Any, Dict, List, Optional, Set

_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.-]*)=(\S*)")

#: The fields of ``scontrol show node`` (Slurm 22.05 to 24.05, ``slurm/src/api/node_info.c``
#: ``slurm_sprint_node_table``): one of them after ``Reason=`` ends the reason; any other
#: ``Key=`` there is the reason's own text (an operator's ``reason="a=b"``).
KNOWN_FIELDS = frozenset((
    "NodeName", "Arch", "CoresPerSocket", "CPUAlloc", "CPUEfctv", "CPUTot", "CPULoad", "AvailableFeatures",
    "ActiveFeatures", "Gres", "GresDrain", "GresUsed", "NodeAddr", "NodeHostName", "Version", "OS", "RealMemory",
    "AllocMem", "FreeMem", "Sockets", "Boards", "State", "ThreadsPerCore", "TmpDisk", "Weight", "Owner", "MCS_label",
    "Partitions", "BootTime", "SlurmdStartTime", "LastBusyTime", "ResumeAfterTime", "CfgTRES", "AllocTRES",
    "CurrentWatts", "AveWatts", "ExtSensorsJoules", "ExtSensorsWatts", "ExtSensorsTemp", "Comment", "Extra",
    "InstanceId", "InstanceType", "Topology", "CpuBind", "MemSpecLimit", "CoreSpecCount", "CPUSpecList",
    "NextState", "Reservation", "LastBusyTime", "Port", "Features", "ReasonTime", "ReasonUser"))
_KNOWN_AFTER = re.compile(r"\s(%s)=" % "|".join(sorted(KNOWN_FIELDS, key=len, reverse=True)))
#: Characters of a ``scontrol show node`` answer read at most (a node's answer is about 1 kB).
MAX_SHOW_NODE = 65536

#: slurmctld's own drain reason when slurmd registers fewer GPUs than ``gres.conf`` / ``slurm.conf``
#: configure (``slurm/src/common/gres.c`` ``_node_config_validate``: ``"%s count reported lower than
#: configured (%"PRIu64" < %"PRIu64")"``; field case 41, awslabs/awsome-distributed-ai issue 195).
_GPU_COUNT_REASON = re.compile(r"^gres/gpu(?::[^ ]*)? count reported lower than configured \((\d+) < (\d+)\)$")
#: The user slurmctld sets its own reasons as (``SlurmUser``: ``slurm`` in Debian's and most sites'
#: slurm.conf, ``root`` where slurm.conf leaves it out, slurm.conf(5): "The default value is "root"").
SLURM_USER = "slurm"
#: Users slurmctld's own GPU-count reason is recognised from: its text is slurmctld's, which nobody types.
SLURMCTLD_USERS = (SLURM_USER, "root")


def _node_block(text: str) -> str:
    """The first node's answer as one line: ``-o`` gives one line; without it, the node's fields
    span indented lines up to the next ``NodeName=``."""
    lines = [ln.strip() for ln in text[:MAX_SHOW_NODE].splitlines()]
    block = []  # type: List[str]
    for line in lines:
        if not line:
            continue
        if line.startswith("NodeName=") and block:
            break
        block.append(line)
    return " ".join(block)


def parse_slurm_show_node(text: str, expect: Optional[str] = None) -> Dict[str, Any]:
    """Parse ``scontrol show node -o NODE`` (or the same answer without ``-o``, its fields on
    indented lines).

    :param text: the command's output (the first node's answer is read; at most
        :data:`MAX_SHOW_NODE` characters).
    :param expect: the node that was asked for (its ``NodeName``, or the ``NodeHostName`` or
        ``NodeAddr`` Slurm also finds a node by): an answer for another node is refused.
    :returns: ``{"name", "state" (base state, e.g. ``IDLE``), "flags" ([``DRAIN``, ...]),
        "drained" (no job left: ``DRAIN`` on an idle node, or ``DOWN``), "draining" (``DRAIN``
        while jobs run), "out_of_service" (``DRAIN``, ``DOWN`` or ``FAIL``), "reason" (text
        without the ``[user@time]`` suffix, or None), "reason_by" (``user@time`` or None),
        "reason_user", "reason_time" (ISO text as Slurm writes it, or None), "gres",
        "partitions" ([names]), "gpus_configured" (``CfgTRES`` ``gres/gpu=N``, or None),
        "drain_kind": :func:`drain_kind`, "gpu_count": ``{"reported", "configured"}`` for a
        ``gpu_count`` drain, else None}``.
    :raises ValueError: when the text has no ``NodeName=`` field (not a node's answer), or names
        another node than ``expect``.
    """
    line = _node_block(str(text or ""))
    head, sep, reason = line.partition(" Reason=")
    if not sep and line.startswith("Reason="):
        head, sep, reason = "", "Reason=", line[len("Reason="):]
    fields = dict(_FIELD.findall(head))
    tail = ""
    if sep:
        # The reason ends at its [user@time] stamp, or at a known field; what follows are fields.
        stamp = re.match(r"^(.*?\[[^\]\s]*@[^\]\s]*\])(.*)$", reason)
        if stamp:
            reason, tail = stamp.group(1), stamp.group(2)
        else:
            known = _KNOWN_AFTER.search(" " + reason)
            if known:
                reason, tail = reason[:known.start()], reason[known.start():]
        for key, value in _FIELD.findall(tail):
            if key in KNOWN_FIELDS:
                fields.setdefault(key, value)   # the head's fields win
    if "NodeName" not in fields:
        raise ValueError("not a line of scontrol show node -o: %r" % line[:200])
    if expect is not None and expect not in (fields["NodeName"], fields.get("NodeHostName"), fields.get("NodeAddr")):
        raise ValueError("scontrol show node answered for node %r, not for %r, the node asked for"
                         % (fields["NodeName"][:100], expect))
    parts = [p for p in (fields.get("State") or "").upper().split("+") if p]
    base = parts[0] if parts else None
    flags = parts[1:]
    reason_text, reason_by = None, None
    if sep and reason.strip() and reason.strip() != "(null)":
        match = re.match(r"^(.*?)\s*\[([^\]]*)\]\s*$", reason.strip())
        reason_text, reason_by = (match.group(1), match.group(2)) if match else (reason.strip(), None)
    user, _at, when = (reason_by or "").partition("@")
    drain = "DRAIN" in flags or base in ("DRAINED", "DRAINING")
    busy = base in ("ALLOCATED", "MIXED", "COMPLETING", "DRAINING") or "COMPLETING" in flags
    down = base in ("DOWN", "FAIL") or "FAIL" in flags
    configured = re.search(r"(?:^|,)gres/gpu=(\d+)(?:,|$)", fields.get("CfgTRES") or "")
    node = {"name": fields["NodeName"], "state": base, "flags": flags,
            "drained": (drain and not busy) or down, "draining": drain and busy,
            "out_of_service": drain or down, "reason": reason_text, "reason_by": reason_by,
            "reason_user": user or None, "reason_time": when or None,
            "gres": fields.get("Gres") if fields.get("Gres") not in (None, "(null)") else None,
            "partitions": [p for p in (fields.get("Partitions") or "").split(",") if p],
            "gpus_configured": int(configured.group(1)) if configured else None,
            # scontrol marks a node slurmctld cannot reach with "*" (IDLE*) or NOT_RESPONDING, and one
            # whose reboot is not complete with REBOOT_ISSUED; SlurmdStartTime changes at each start.
            "responding": not any(p.endswith("*") or p == "NOT_RESPONDING" for p in parts),
            "reboot_issued": "REBOOT_ISSUED" in parts,
            "slurmd_start_time": fields.get("SlurmdStartTime") if fields.get("SlurmdStartTime") not in (None, "None") else None}
    node.update(drain_kind(node))
    return node


def drain_kind(node: Dict[str, Any]) -> Dict[str, Any]:
    """Who took a Slurm node out of service, and why, from its state and reason.

    :param node: :func:`parse_slurm_show_node`'s ``out_of_service``, ``reason`` and ``reason_user``.
    :returns: ``{"drain_kind": None (in service) | "gpu_count" (slurmctld drained it because slurmd
        registered fewer GPUs than configured: a GPU or driver fault, not a hold; it is never
        resumed before the count matches) | "scheduler" (another reason slurmctld set itself) |
        "operator" (a person or another tool), "gpu_count": {"reported": int, "configured": int}
        | None}``.
    """
    if not node.get("out_of_service"):
        return {"drain_kind": None, "gpu_count": None}
    match = _GPU_COUNT_REASON.match(node.get("reason") or "")
    if node.get("reason_user") in SLURMCTLD_USERS and match:
        return {"drain_kind": "gpu_count",
                "gpu_count": {"reported": int(match.group(1)), "configured": int(match.group(2))}}
    if node.get("reason_user") == SLURM_USER:
        return {"drain_kind": "scheduler", "gpu_count": None}
    return {"drain_kind": "operator", "gpu_count": None}


def describe_drain(sched: Dict[str, Any]) -> str:
    """How the preflight and the reports name a node's scheduler state: ``"drained by Slurm itself:
    Slurm sees 0 of 1 configured GPUs (gres/gpu count reported lower than configured (0 < 1),
    slurm@2024-12-19T11:03:34): a GPU or driver fault, not a maintenance hold"``, else the reason
    (or ``"no reason"``)."""
    count = sched.get("gpu_count") if isinstance(sched.get("gpu_count"), dict) else None
    stamp = (", %s" % sched["reason_by"]) if sched.get("reason_by") else ""
    if sched.get("drain_kind") == "gpu_count" and count:
        return ("drained by Slurm itself: Slurm sees %d of %d configured GPUs (%s%s): a GPU or driver fault, not a "
                "maintenance hold; check the driver and the GPU count, it is not resumed before the count matches"
                % (count["reported"], count["configured"], sched.get("reason"), stamp))
    if sched.get("drain_kind") == "scheduler":
        return "drained by Slurm itself (%s%s)" % (sched.get("reason") or "no reason", stamp)
    return "%s%s" % (sched.get("reason") or "no reason", stamp)


def drain_state(backend: str, output: Optional[str], node: Optional[str] = None) -> Dict[str, Any]:
    """Whether the node is out of service in its scheduler now, from the backend's read command.

    :param backend: ``slurm``, ``slurm_reboot`` (read as ``slurm``: the same node state),
        ``kubernetes``, ``command`` or ``none``.
    :param output: ``scontrol show node -o NAME`` (slurm, slurm_reboot) or the ``unschedulable`` jsonpath
        (kubernetes); ignored for the others.
    :param node: the Slurm node name asked for (an answer for another node is refused).
    :returns: ``{"backend", "known": bool, "out_of_service": bool | None, "draining": bool,
        "reason": str | None, "reason_by": str | None, "state": str | None, "drain_kind",
        "gpu_count" (:func:`drain_kind`), "resume_blocked": bool (a ``gpu_count`` drain: not to be
        resumed before Slurm sees every configured GPU)}``; ``known`` is false for ``command`` and
        ``none``, which cannot be asked. Slurm's answer adds ``"responding"`` (slurmctld reaches
        slurmd: no ``*``, no ``NOT_RESPONDING``), ``"reboot_issued"`` and ``"slurmd_start_time"``
        (``SlurmdStartTime``, text as Slurm writes it, or None): what tells a restarted slurmd's
        registration.
    :raises ValueError: for an unknown backend or output Slurm does not write.
    """
    if backend in ("slurm", "slurm_reboot"):
        parsed = parse_slurm_show_node(output or "", node)
        return {"backend": backend, "known": True, "out_of_service": parsed["out_of_service"],
                "draining": parsed["draining"], "reason": parsed["reason"], "reason_by": parsed["reason_by"],
                "state": "+".join([parsed["state"] or ""] + parsed["flags"]), "drain_kind": parsed["drain_kind"],
                "gpu_count": parsed["gpu_count"], "resume_blocked": parsed["drain_kind"] == "gpu_count",
                "responding": parsed["responding"], "reboot_issued": parsed["reboot_issued"],
                "slurmd_start_time": parsed["slurmd_start_time"]}
    if backend == "kubernetes":
        cordoned = str(output or "").strip().lower() == "true"
        return {"backend": backend, "known": True, "out_of_service": cordoned, "draining": False,
                "reason": "cordoned" if cordoned else None, "reason_by": None,
                "state": "cordoned" if cordoned else "schedulable", "drain_kind": "operator" if cordoned else None,
                "gpu_count": None, "resume_blocked": False}
    if backend in ("command", "none"):
        return {"backend": backend, "known": False, "out_of_service": None, "draining": False, "reason": None,
                "reason_by": None, "state": None, "drain_kind": None, "gpu_count": None, "resume_blocked": False}
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
#: Characters of one hostlist expression read at most (squeue's %N of a job on 10,000 nodes with
#: scattered names is far shorter).
MAX_HOSTLIST_TEXT = 1048576


def expand_hostlist(text: str) -> List[str]:
    """Expand a Slurm hostlist expression: ``"gpu[01-03,07],login1"`` → ``["gpu01", "gpu02",
    "gpu03", "gpu07", "login1"]``.

    Brackets hold comma-separated numbers and ``a-b`` ranges; a range keeps the width of its
    first number (``[08-10]`` → ``08, 09, 10``). Several bracket groups in one name multiply.
    :raises ValueError: for unbalanced brackets, a range that is not ``a-b`` with ``a <= b``, a
        text longer than :data:`MAX_HOSTLIST_TEXT`, or more than :data:`MAX_HOSTLIST` names (counted
        before any is built: one squeue line cannot exhaust the controller's memory).
    """
    text = str(text or "").strip()
    shown = text[:200]
    if len(text) > MAX_HOSTLIST_TEXT:
        raise ValueError("hostlist %r... is longer than %d characters" % (shown, MAX_HOSTLIST_TEXT))
    names = []  # type: List[str]
    for item in _split_top(text):
        expanded = [""]
        rest = item
        while rest:
            head, sep, tail = rest.partition("[")
            if "]" in head:
                raise ValueError("unbalanced ] in hostlist %r" % shown)
            if not sep:
                expanded = [e + head for e in expanded]
                break
            inner, close, rest = tail.partition("]")
            if not close or "[" in inner:
                raise ValueError("unbalanced [ in hostlist %r" % shown)
            ranges = []
            count = 0
            for part in inner.split(","):
                match = _RANGE.match(part.strip())
                if not match:
                    raise ValueError("bad range %r in hostlist %r" % (part[:40], shown))
                low, high = match.group(1), match.group(2) or match.group(1)
                if int(high) < int(low):
                    raise ValueError("bad range %r in hostlist %r" % (part[:40], shown))
                ranges.append((low, high))
                count += int(high) - int(low) + 1
                if count > MAX_HOSTLIST:
                    raise ValueError("hostlist %r names more than %d nodes" % (shown, MAX_HOSTLIST))
            # Counted before it is built: two groups multiply.
            if len(expanded) * count + len(names) > MAX_HOSTLIST:
                raise ValueError("hostlist %r names more than %d nodes" % (shown, MAX_HOSTLIST))
            values = [str(n).zfill(len(low)) for low, high in ranges for n in range(int(low), int(high) + 1)]
            expanded = [e + head + v for e in expanded for v in values]
        names.extend(e for e in expanded if e)
        if len(names) > MAX_HOSTLIST:
            raise ValueError("hostlist %r names more than %d nodes" % (shown, MAX_HOSTLIST))
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


def slurm_busy_nodes(text: str) -> Optional[Set[str]]:
    """The Slurm nodes with a running (or completing) job: the nodes whose drain is not over.

    :param text: ``squeue --noheader --states=RUNNING,COMPLETING --format=%N|%L`` output.
    :returns: the node names; ``None`` when a line cannot be read (which nodes it names is
        unknown: the caller must take every node as possibly idle, never as busy).
    """
    out = set()  # type: Set[str]
    for line in str(text or "").splitlines():
        if not line.strip():
            continue
        nodes, sep, _left = line.strip().rpartition("|")
        if not sep or not nodes:
            return None
        try:
            out.update(expand_hostlist(nodes))
        except ValueError:
            return None
    return out


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
