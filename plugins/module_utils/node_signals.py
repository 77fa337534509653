# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Node-level driver signals that carry no Xid number: companion modules, signatures, resets.

Pure functions over text a node prints:

- :func:`module_load_failures`: kernel log lines where a module of the NVIDIA driver set
  (``nvidia``, ``nvidia_uvm``, ``nvidia_modeset``, ``nvidia_drm``, ``nvidia_peermem``) could not be
  loaded: a symbol version mismatch with the running kernel's modules (``nvidia_peermem:
  disagrees about version of symbol ib_register_peer_memory_client``, field case 32) or a
  signature the kernel refused under Secure Boot / lockdown (``Loading of unsigned module is
  rejected``, ``Key was rejected by service``, field case 33);
- :func:`reset_required_messages`: NVRM messages that say a GPU needs a reset without an Xid
  number (``Back to back GSP RPC timeout detected! GPU marked for reset``,
  ``NV_ERR_RESET_REQUIRED``, field case 30);
- :func:`parse_mokutil_sb_state`: ``mokutil --sb-state`` → Secure Boot on / off;
- :func:`module_signer`: the ``signer:`` line of ``modinfo nvidia``.

Kernel message texts: Linux ``kernel/module/main.c`` ("disagrees about version of symbol",
"Unknown symbol ... (err %d)") and ``kernel/module/signing.c`` ("Loading of unsigned module is
rejected", "Loading of module with unavailable key is rejected"); ``modprobe`` prints
"Key was rejected by service" for EKEYREJECTED. Standard library only; runs on managed nodes.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id
from ansible_collections.gpufleet.nvidia.plugins.module_utils.kernel_log import split_line

#: Modules of the NVIDIA driver package set, as the kernel names them (``-`` and ``_`` both seen).
DRIVER_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")

_MODULE = r"(?P<module>nvidia(?:[-_](?:uvm|modeset|drm|peermem))?)"
_SYMBOL_VERSION = re.compile(r"^" + _MODULE + r": disagrees about version of symbol (?P<symbol>\S+)")
_UNKNOWN_SYMBOL = re.compile(r"^" + _MODULE + r": Unknown symbol (?P<symbol>\S+)(?: \(err (?P<err>-?\d+)\))?")
# "module verification failed: signature and/or required key missing - tainting kernel" is not
# here: the kernel writes it when it loads an unsigned module without enforcing signatures (the
# module runs, the kernel is tainted); only a rejection keeps the module out.
_SIGNATURE = re.compile(
    r"(?:Loading of (?:unsigned module|module with unavailable key) is rejected"
    r"|Key was rejected by service)", re.IGNORECASE)
_INSERT_FAILED = re.compile(r"could not insert '" + _MODULE + r"': (?P<why>.+)$")
_RESET_REQUIRED = re.compile(r"GPU marked for reset|NV_ERR_RESET_REQUIRED|\bReset required\b", re.IGNORECASE)
_GPU_BUS = re.compile(r"\b(?:PCI:)?((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")


def _module_name(raw: str) -> str:
    return raw.replace("-", "_")


def module_load_failures(text: Optional[str]) -> List[Dict[str, Any]]:
    """Find the NVIDIA driver modules the kernel refused to load, one entry per module and reason.

    :param text: kernel log text (any ``kernel_log`` format: dmesg, ``dmesg -T``, journalctl,
        Talos) and optionally the output of a failed ``modprobe``; ``None`` gives ``[]``.
    :returns: ``[{"module": "nvidia_peermem", "reason": "symbol_version_mismatch" |
        "unknown_symbol" | "signature_rejected" | "insert_failed", "symbols": [str], "error": int |
        None (the kernel's errno, e.g. -22), "count": int (lines), "first_time": str | float | None,
        "last_time": same, "first_line": str}]`` in the order of their first line. A
        ``signature_rejected`` line names no module (the kernel does not): its ``module`` is
        ``"nvidia"`` when the log names no other NVIDIA module around it. ``unknown_symbol`` lines
        of a module that also has ``symbol_version_mismatch`` lines fold into that entry.
    :raises: nothing.
    """
    found = {}  # type: Dict[tuple, Dict[str, Any]]
    order = []  # type: List[tuple]

    def note(module: str, reason: str, line: str, when: Any, symbol: Optional[str] = None,
             error: Optional[int] = None) -> None:
        key = (module, reason)
        entry = found.get(key)
        if entry is None:
            entry = {"module": module, "reason": reason, "symbols": [], "error": None, "count": 0,
                     "first_time": when, "last_time": when, "first_line": line.strip()}
            found[key] = entry
            order.append(key)
        entry["count"] += 1
        entry["last_time"] = when
        if symbol and symbol not in entry["symbols"]:
            entry["symbols"].append(symbol)
        if error is not None:
            entry["error"] = error

    for line in (text or "").splitlines():
        if not line.strip():
            continue
        mono, wall, message = split_line(line)
        when = mono if mono is not None else wall
        match = _SYMBOL_VERSION.search(message)
        if match:
            note(_module_name(match.group("module")), "symbol_version_mismatch", line, when, match.group("symbol"))
            continue
        match = _UNKNOWN_SYMBOL.search(message)
        if match:
            module = _module_name(match.group("module"))
            reason = "symbol_version_mismatch" if (module, "symbol_version_mismatch") in found else "unknown_symbol"
            error = int(match.group("err")) if match.group("err") else None
            note(module, reason, line, when, match.group("symbol"), error)
            continue
        if _SIGNATURE.search(message):
            module_match = re.search(_MODULE, message)
            note(_module_name(module_match.group("module")) if module_match else "nvidia",
                 "signature_rejected", line, when)
            continue
        match = _INSERT_FAILED.search(message)
        if match:
            module = _module_name(match.group("module"))
            why = match.group("why").strip()
            if "Key was rejected" in why:
                note(module, "signature_rejected", line, when)
            elif not any(key[0] == module for key in found):
                note(module, "insert_failed", line, when)
    return [found[key] for key in order]


def reset_required_messages(text: Optional[str]) -> List[Dict[str, Any]]:
    """NVRM lines that say a GPU needs a reset without an Xid number (field case 30).

    :param text: kernel log text, or ``None``.
    :returns: ``[{"pci_bus_id": "0000:0b:00.0" | None (the line names no GPU), "time": float |
        str | None, "message": str, "first_line": str}]``. Lines holding ``NVRM: Xid`` are left
        to ``kernel_log.parse_kernel_log``.
    :raises: nothing.
    """
    messages = []
    for line in (text or "").splitlines():
        if "NVRM" not in line or "Xid" in line or not _RESET_REQUIRED.search(line):
            continue
        mono, wall, message = split_line(line)
        bus = _GPU_BUS.search(message.split("NVRM:", 1)[-1])
        messages.append({
            "pci_bus_id": normalize_pci_bus_id(bus.group(1)) if bus else None,
            "time": mono if mono is not None else wall,
            "message": re.sub(r"^NVRM:\s*", "", message)[:300],
            "first_line": line.strip()[:1024],
        })
    return messages


def parse_mokutil_sb_state(text: Optional[str]) -> Optional[bool]:
    """``mokutil --sb-state`` → ``True`` (``SecureBoot enabled``), ``False`` (``SecureBoot disabled``,
    or ``EFI variables are not supported on this system``: a legacy BIOS boot has no Secure Boot),
    ``None`` for anything else or ``None``."""
    if not text:
        return None
    lowered = text.lower()
    if "secureboot enabled" in lowered:
        return True
    if "secureboot disabled" in lowered or "efi variables are not supported" in lowered:
        return False
    return None


def module_signer(modinfo_text: Optional[str]) -> Optional[str]:
    """The ``signer:`` of ``modinfo nvidia`` (``"DKMS module signing key"``), ``None`` when unsigned or not read."""
    for line in (modinfo_text or "").splitlines():
        key, _sep, value = line.partition(":")
        if key.strip() == "signer" and value.strip():
            return value.strip()
    return None
