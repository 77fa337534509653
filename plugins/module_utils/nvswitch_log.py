# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVSwitch SXid events in a kernel log: the NVLink fabric's own errors.

On NVSwitch systems (HGX/DGX H100, H200, B200 baseboards) the switch driver
(``nvidia-nvswitch``, one instance per switch) prints its errors as SXids, the switch's
counterpart of a GPU's Xid:

    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up
    nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00
    nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, ...}

The first record of an error carries the driver's own classification (``Fatal`` or
``Non-fatal``) and the link; the ``Severity ...`` and ``Data {...}`` records after it are
continuation records of the same SXid. A fatal SXid means the fabric lost a link or a switch
engine: GPUs that talk over it fail their NVLink traffic, and the fabric must be re-initialised
(node reboot, or a Fabric Manager restart with the GPUs reset) and the node verified again.
Sources: NVIDIA Fabric Manager User Guide ("NVSwitch errors", SXid fatal / non-fatal), the
nvidia-nvswitch driver's log lines as quoted in leptonai/gpud
``components/accelerator/nvidia/sxid/README.md`` (field case 37).

Pure functions over text; standard library only; runs on managed nodes.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id
from ansible_collections.gpufleet.nvidia.plugins.module_utils.kernel_log import records

#: SXid lines (the switch instance, its PCI bus id, the number, the rest of the record).
SXID_LINE = re.compile(
    r"^(?P<switch>nvidia-nvswitch\d*): SXid \((?:PCI:)?(?P<bus>[0-9a-fA-F:.]+)\):\s*(?P<sxid>\d+),\s*(?P<rest>.*)$")
_CLASS = re.compile(r"^(?P<word>Fatal|Non-fatal|Nonfatal|Non fatal)\b", re.IGNORECASE)
_LINK = re.compile(r"\bLink (?P<link>\d+)\b")

#: SXids this reader names. Every other number is still read, counted and judged by the driver's
#: own Fatal / Non-fatal word; only its name is generic.
SXID_CATALOG = {
    20034: {
        "name": "NVLink link went down from active (LTSSM fault up)",
        "source": "leptonai/gpud components/accelerator/nvidia/sxid/README.md; field case 37",
    },
}

#: Events kept per (switch bus id, SXid); further records are counted, not listed.
MAX_SXID_KEYS = 256

#: What a fatal SXid asks for (the action vocabulary of xid_catalog.ACTIONS) and in words.
FATAL_ACTION = "reboot"
FATAL_REMEDY = ("re-initialise the NVLink fabric: reboot the node (or restart nvidia-fabricmanager with the GPUs "
                "reset), then verify it again; inspect the switch tray and cables if the same links fail again")


def parse_sxids(text: Optional[str]) -> List[Dict[str, Any]]:
    """Fold the SXid records of a kernel log into one event per NVSwitch and SXid.

    :param text: kernel log text (any ``kernel_log`` format), or ``None``.
    :returns: ``[{"switch": "nvidia-nvswitch0", "pci_bus_id": "0000:05:00.0", "sxid": 20034,
        "name": str, "fatal": bool | None (the driver's word; ``None`` when no record of it said),
        "fatal_records": int (records that say Fatal), "records": int (all records, the
        continuation ones included), "links": [int] (sorted), "message": str (the first
        classified record's text after the number), "time": float | str | None (first record:
        seconds since boot, or the printed wall time), "first_line": str, "action": "reboot" for a
        fatal one else "ignore", "known": bool (in :data:`SXID_CATALOG`)}]`` in the order of their
        first record; at most :data:`MAX_SXID_KEYS` entries.
    :raises: nothing.
    Source: nvidia-nvswitch driver log format (module docstring).
    """
    found = {}  # type: Dict[Tuple[Optional[str], int], Dict[str, Any]]
    for first_line, message, mono, wall, marker in records(text):
        if marker or "SXid" not in message:
            continue
        match = SXID_LINE.search(message)
        if match is None:
            continue
        bus = normalize_pci_bus_id(match.group("bus")) or match.group("bus").lower()
        sxid = int(match.group("sxid"))
        key = (bus, sxid)
        event = found.get(key)
        if event is None:
            if len(found) >= MAX_SXID_KEYS:
                continue
            known = SXID_CATALOG.get(sxid)
            event = found[key] = {
                "switch": match.group("switch"), "pci_bus_id": bus, "sxid": sxid,
                "name": known["name"] if known else "NVSwitch error SXid %d" % sxid,
                "fatal": None, "fatal_records": 0, "records": 0, "links": [], "message": None,
                "time": mono if mono is not None else wall, "first_line": first_line[:1024],
                "action": "ignore", "known": known is not None,
            }
        event["records"] += 1
        rest = match.group("rest").strip()
        word = _CLASS.match(rest)
        if word:
            fatal = word.group("word").lower() == "fatal"
            event["fatal"] = bool(event["fatal"]) or fatal
            if fatal:
                event["fatal_records"] += 1
                event["action"] = FATAL_ACTION
            if event["message"] is None:
                event["message"] = rest[:300]
            link = _LINK.search(rest)
            if link and int(link.group("link")) not in event["links"]:
                event["links"].append(int(link.group("link")))
    events = list(found.values())
    for event in events:
        event["links"].sort()
        if event["message"] is None:
            event["message"] = event["first_line"].split("): ", 1)[-1][:300]
    return events


def fabric_problem(events: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The node-level fabric fault that fatal SXids make, or ``None``.

    :param events: :func:`parse_sxids`.
    :returns: ``{"switches": [bus id, ...] (sorted), "fatal_records": int, "sxids": [int]
        (sorted), "evidence": [first lines, at most 3]}`` when any event is fatal; else ``None``.
    :raises: nothing.
    """
    fatal = [event for event in events or [] if event.get("fatal")]
    if not fatal:
        return None
    return {
        "switches": sorted(set(str(event["pci_bus_id"]) for event in fatal)),
        "fatal_records": sum(int(event.get("fatal_records") or 0) for event in fatal),
        "sxids": sorted(set(int(event["sxid"]) for event in fatal)),
        "evidence": [event["first_line"] for event in fatal[:3]],
    }
