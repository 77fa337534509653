# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's simulated kernel log: one log per boot, kept in the state file.

``state["kernel_log"] = {"boot_id", "boot_time" (epoch s), "lines": [[seconds since boot, text]]}``;
the log of the boot before is kept as ``state["kernel_log_previous"]``. Rendering follows
``dmesg``: ``[%5d.%06d] text`` by default, ``[Day Mon dd hh:mm:ss yyyy] text`` with ``-T``.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional


def pci_xid_location(bus_id: str) -> str:
    """``00000000:18:00.0`` -> ``PCI:0000:18:00`` (the location field of NVRM Xid lines)."""
    short = bus_id[-12:] if len(bus_id) >= 12 else bus_id
    return "PCI:" + short.rsplit(".", 1)[0].lower()


def start_boot(state: Dict[str, Any], boot_id: Optional[str], boot_time: float, release: str) -> Dict[str, Any]:
    """Begin a new log for a new boot (the current one becomes ``kernel_log_previous``)."""
    if state.get("kernel_log"):
        state["kernel_log_previous"] = state["kernel_log"]
    log = {"boot_id": boot_id, "boot_time": boot_time, "lines": []}
    state["kernel_log"] = log
    append(state, "Linux version %s (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0, "
                  "GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian" % release, at=0.0)
    append(state, "Command line: BOOT_IMAGE=/vmlinuz-%s root=/dev/mapper/vg0-root ro quiet" % release, at=0.0)
    return log


def append(state: Dict[str, Any], text: str, at: Optional[float] = None) -> None:
    """Append one line; ``at`` = seconds since boot (default: now), never before the last line."""
    log = state.get("kernel_log")
    if not log:
        log = {"boot_id": None, "boot_time": time.time(), "lines": []}
        state["kernel_log"] = log
    if at is None:
        at = max(0.0, time.time() - float(log.get("boot_time") or time.time()))
    lines: List[List[Any]] = log["lines"]
    if lines and at <= lines[-1][0]:
        at = lines[-1][0] + 0.000004
    lines.append([round(at, 6), text])


def xid_lines(gpu: Dict[str, Any], xid: int, text: str, pid: Optional[int] = None,
              process: Optional[str] = None) -> List[str]:
    """The NVRM lines of one Xid event on ``gpu`` (Xid 79 adds the "fallen off the bus" line)."""
    where = pci_xid_location(gpu["pci"]["bus_id"])
    if pid is None:
        who = "pid='<unknown>', name=<unknown>"
    else:
        who = "pid=%d, name=%s" % (pid, process or "python3")
    lines = ["NVRM: Xid (%s): %d, %s, %s" % (where, xid, who, text)]
    if xid == 79:
        lines.insert(0, "NVRM: GPU at %s: %s" % (where, gpu["uuid"]))
        lines.insert(1, "NVRM: GPU Board Serial Number: %s" % gpu["serial"])
        lines.append("NVRM: GPU %s: GPU has fallen off the bus." % gpu["pci"]["bus_id"][4:].lower())
    return lines


def render(log: Optional[Dict[str, Any]], human_time: bool = False, no_time: bool = False) -> str:
    """The log as ``dmesg`` prints it (empty string for no log)."""
    if not log:
        return ""
    out = []
    boot_time = float(log.get("boot_time") or 0.0)
    for at, text in log.get("lines", []):
        if no_time:
            out.append(text)
        elif human_time:
            stamp = time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(boot_time + at))
            out.append("[%s] %s" % (stamp, text))
        else:
            sec = int(at)
            usec = int(round((at - sec) * 1000000))
            if usec >= 1000000:
                sec, usec = sec + 1, usec - 1000000
            out.append("[%5d.%06d] %s" % (sec, usec, text))
    return "\n".join(out) + ("\n" if out else "")
