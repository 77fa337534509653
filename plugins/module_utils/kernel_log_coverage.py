# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which kernel-log lines of the NVIDIA modules no reader understood: fail loud, not silent.

A node is healthy only when every signal was read and none was bad. The readers of the kernel log
(``kernel_log``: Xids, "fallen off the bus", rate limiting, API mismatch, GPU identities;
``node_signals``: module load failures, reset-required and init-failure messages; ``nvswitch_log``:
SXids) each read some lines. A line from an NVIDIA module (``NVRM:``, ``nvidia-nvswitch``,
``nvidia-modeset``, ``nvidia-peermem``, ``nvidia_uvm``, ``nvidia-nvlink``, ``nvidia-drm``, the
``nvidia`` module itself) that none of them reads, and that is not one of the known
informational lines (:data:`INFORMATIONAL`), is *unrecognised*: it is kept (count, the first
lines, the bus id it names) and shown. At error level it makes the node's health ``unknown``
(gpu_health.node_health), which no gate accepts as verified.

The level is the one the log printed (``dmesg -r`` ``<3>``, ``dmesg -x`` ``kern  :err   :``,
Talos ``kern: warning:``); a log that prints none (plain ``dmesg``, ``journalctl -k``, syslog)
is judged by its words (:data:`ERROR_WORDS`). Lines printed within :data:`CONTEXT_S` seconds
after a line a reader took as an error (an Xid, an SXid, a GPU that failed to initialise, an API
mismatch) are that error's context, its RPC tables and stack dumps (field case 06), and are
counted as such. journald's ``[355B blob data]`` stands for a message whose text is not in the
output: it is unrecognised at error level, since nothing can be said of it (``journalctl -a``
prints it).

Pure functions; standard library only; runs on managed nodes.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log, node_signals, nvswitch_log
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id

#: The message of a line written by an NVIDIA module (after the time prefix).
NVIDIA_SOURCE = re.compile(
    r"^(?:NVRM\b|nvidia(?:-nvswitch\d*|[-_](?:modeset|peermem|uvm|drm|nvlink|fs))?(?=[\s:\[])"
    r"|\[drm\] \[nvidia-drm\]|\[drm\] Initialized nvidia-drm|\[drm:nv)")

#: Lines of the NVIDIA modules that say nothing about health: read, on purpose, as information.
#: Sources: the driver's load and probe messages as printed by R470 to R610 (kernel logs of
#: field cases 06, 08, 23, 30, 32, 37 and NVIDIA/open-gpu-kernel-modules issue threads).
INFORMATIONAL = tuple(re.compile(pattern) for pattern in (
    r"^NVRM: loading NVIDIA UNIX",                                 # module banner with its version
    r"^nvidia-modeset: Loading NVIDIA",                            # nvidia-modeset banner
    r"^nvidia-uvm: Loaded the UVM driver",                         # nvidia-uvm banner
    r"^nvidia-nvlink: Nvlink Core is being initialized",           # nvidia-nvlink banner
    r"^nvidia-nvlink: Unregistered Nvlink Core",                   # its unload
    r"^nvidia-nvswitch\d*: Probing device",                        # switch probe
    r"^nvidia: loading out-of-tree module taints kernel",          # kernel taint notes
    r"^nvidia: module license .* taints kernel",
    r"^nvidia: module verification failed: signature and/or required key missing - tainting kernel",
    r"^nvidia_uvm: module uses symbols (?:.* )?from proprietary module nvidia, inheriting taint",
    r"^nvidia-uvm: Unloaded the UVM driver",                       # module unloads
    r"^nvidia-modeset: Unloading",
    r"^\[drm\] \[nvidia-drm\] \[GPU ID 0x[0-9a-fA-F]+\] Unloading driver",
    r"^nvidia-nvswitch\d*: (?:using MSI|open \(major=\d+\)|close)",  # switch device opened by Fabric Manager
    r"^nvidia-nvlink: nvlink driver (?:open|close)",
    r"^nvidia \S+: (?:enabling device|vgaarb:|PCI INT|irq \d+|Adding to iommu group)",  # PCI core, per device
    r"^\[drm\] \[nvidia-drm\] \[GPU ID 0x[0-9a-fA-F]+\] Loading driver",
    r"^\[drm\] Initialized nvidia-drm",
    r"^NVRM: Persistence mode is deprecated",
    r"^NVRM: GPU \S+: (?:GPU|RmInitAdapter) succeeded",
    r"^NVRM: GPU \S+: GPU serial number is \S+",                   # told with "fallen off the bus"
    # nvidia-peermem when a peer-memory client frees memory after its context went (NCCL teardown)
    r"^nvidia-peermem nv_get_p2p_free_callback:\d+ ERROR detected invalid context, skipping further processing",
))

#: Words that make a line without a printed level an error-level line.
ERROR_WORDS = re.compile(
    r"\b(?:error|errors|fail|failed|failure|fault|faulted|timeout|timed out|unable|cannot|can't|could not"
    r"|invalid|bad|lost|reset|corrupt(?:ed)?|abort(?:ed)?|fatal|mismatch|not responding|hang|hung|"
    r"assert(?:ion)?|exception|panic|oops|unexpected)\b", re.IGNORECASE)

#: Seconds after an error line during which NVIDIA lines are its context (dumps, tables).
CONTEXT_S = 2.0
#: Unrecognised lines kept one by one (all are counted).
MAX_LINES = 16

_LEVEL_NAMES = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "warning": 4, "notice": 5, "info": 6,
                "debug": 7}
_RAW_LEVEL = re.compile(r"^<(?P<n>\d+)>|^(?P<kmsg>\d+),\d+,\d+,[^;]*;")
_DECODED_LEVEL = re.compile(r"^[a-z]+\s*:(?P<name>[a-z]+)\s*: ")
_TALOS_LEVEL = re.compile(r"^\S+: [a-z]+: (?P<name>[a-z]+): \[")
_BUS = re.compile(r"\b(?:PCI:)?((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")

_OPENS_CONTEXT = (kernel_log.READS[0], kernel_log.READS[1], kernel_log.READS[5], nvswitch_log.SXID_LINE) + tuple(
    node_signals.READS[4:])
_READ = tuple(kernel_log.READS) + tuple(node_signals.READS) + (nvswitch_log.SXID_LINE,)


def _level(first_line: str) -> Optional[int]:
    """The syslog level (0 emerg … 7 debug) the line printed, or ``None``."""
    match = _RAW_LEVEL.match(first_line)
    if match:
        return int(match.group("n") or match.group("kmsg")) & 7
    match = _DECODED_LEVEL.match(first_line) or _TALOS_LEVEL.match(first_line)
    if match:
        return _LEVEL_NAMES.get(match.group("name"))
    return None


def _seconds(mono: Optional[float], wall: Optional[str]) -> Optional[Tuple[str, float]]:
    if mono is not None:
        return "mono", mono
    seconds = kernel_log._wall_seconds(wall)  # pylint: disable=protected-access
    return ("wall", seconds) if seconds is not None else None


def unrecognised_lines(text: Optional[str]) -> Dict[str, Any]:
    """The NVIDIA module lines of a kernel log that no reader understood.

    :param text: kernel log text (any ``kernel_log`` format; escapes are decoded), or ``None``.
    :returns: ``{"count": int (unrecognised messages), "error_count": int (of them at error
        level: printed level err or worse, or, with no printed level, :data:`ERROR_WORDS`),
        "lines": [{"line": str (first physical line, at most 300 characters), "level": "error" |
        "warning" | "info", "pci_bus_id": str | None, "blob": bool}] (the first
        :data:`MAX_LINES`), "by_source": {"NVRM" | "nvidia-nvswitch" | ...: count},
        "context_lines": int (lines read as the context of an error, see the module docstring),
        "informational_lines": int, "read_lines": int (taken by a reader), "nvidia_lines": int (all
        NVIDIA module messages: read + informational + context + unrecognised)}``.
    :raises: nothing.
    """
    result = {"count": 0, "error_count": 0, "lines": [], "by_source": {}, "context_lines": 0,
              "informational_lines": 0, "read_lines": 0, "nvidia_lines": 0}  # type: Dict[str, Any]
    context_until = None  # type: Optional[Tuple[str, float]]
    for first_line, message, mono, wall, marker in kernel_log.records(text):
        if marker:
            context_until = None
            continue
        blob = kernel_log.JOURNALD_BLOB.search(message) is not None
        source = NVIDIA_SOURCE.match(message)
        if source is None and not blob:
            continue
        result["nvidia_lines"] += 1
        when = _seconds(mono, wall)
        if not blob and any(pattern.search(message) for pattern in _READ):
            result["read_lines"] += 1
            if any(pattern.search(message) for pattern in _OPENS_CONTEXT):
                context_until = (when[0], when[1] + CONTEXT_S) if when else ("none", 0.0)
            continue
        if not blob and any(pattern.search(message) for pattern in INFORMATIONAL):
            result["informational_lines"] += 1
            continue
        if not blob and context_until is not None and (
                when is None or (when[0] == context_until[0] and when[1] <= context_until[1])):
            result["context_lines"] += 1
            continue
        level = _level(first_line)
        if blob or (level is not None and level <= 3) or (level is None and ERROR_WORDS.search(message)):
            kind = "error"
        elif level == 4:
            kind = "warning"
        else:
            kind = "info"
        name = "journald" if blob else re.sub(r"\d+$", "", source.group(0).strip("[]: ")) or "nvidia"
        result["count"] += 1
        result["by_source"][name] = result["by_source"].get(name, 0) + 1
        if kind == "error":
            result["error_count"] += 1
        if len(result["lines"]) < MAX_LINES:
            bus = _BUS.search(message.split(":", 1)[-1]) if not blob else None
            result["lines"].append({"line": first_line[:300], "level": kind, "blob": blob,
                                    "pci_bus_id": normalize_pci_bus_id(bus.group(1)) if bus else None})
    return result
