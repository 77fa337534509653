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
- :func:`gpu_init_failures`: a GPU the driver could not initialise (``RmInitAdapter failed!``,
  ``rm_init_adapter failed``), with the cause it printed before (GSP firmware that would not boot:
  ``unexpected WPR2 already up`` ... ``may need to be reset``, field case 38);
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
# "NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x62:0x40:2168)", "... rm_init_adapter failed, device minor number 0"
_INIT_FAILED = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?(?P<bus>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?):?\s+"
    r"(?:RmInitAdapter failed!?\s*(?P<code>\([0-9a-fA-Fx:]+\))?|rm_init_adapter failed(?:, device minor number (?P<minor>\d+))?)")
# What the driver printed before it gave up: by RM GPU instance on R580 and later ("NVRM: GPU0
# _kgspBootGspRm: ..."), with no GPU name on earlier branches ("NVRM: _kgspBootGspRm: ...", R575).
_INIT_CAUSE = re.compile(
    r"NVRM: (?:(?P<gpu>GPU\d+) )?(?P<what>_kgspBootGspRm: unexpected WPR2 already up[^\n]*"
    r"|_kgspBootGspRm: \(the GPU is likely in a bad state and may need to be reset\)"
    r"|RmInitAdapter: Cannot initialize GSP firmware RM"
    r"|kgspWaitForRmInitDone[^\n]*|nvAssertOkFailedNoLog: [^\n]*)")
# The driver's probe message for a GPU it will not drive, printed over several NVRM lines.
_PROBE_GPU = re.compile(r"NVRM: The NVIDIA GPU (?P<bus>[0-9a-fA-F:.]+) \(PCI ID: (?P<pci_id>[0-9a-fA-F:]+)\)")
_PROBE_LEGACY = re.compile(r"NVRM: The NVIDIA (?P<name>.+?) GPU installed in this system is")
_PROBE_PIECES = re.compile(
    r"NVRM: (?:installed in this system (?:is not supported by|requires use of the NVIDIA open kernel modules)"
    r"|nvidia\.ko because it does not include the required GPU|System Processor \(GSP\)\."
    r"|NVIDIA \S+ driver release\.|\s*supported through the NVIDIA \S+ Legacy drivers"
    r"|The \S+ NVIDIA driver will ignore|this GPU\.\s+Continuing probe"
    r"|The NVIDIA probe routine failed for \d+ device|None of the NVIDIA devices were initialized)")
#: Patterns of the lines this module reads (kernel_log_coverage counts every other NVIDIA line).
READS = (_SYMBOL_VERSION, _UNKNOWN_SYMBOL, _SIGNATURE, _INSERT_FAILED, _RESET_REQUIRED, _INIT_FAILED, _INIT_CAUSE,
         _PROBE_GPU, _PROBE_LEGACY, _PROBE_PIECES)


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


def gpu_init_failures(text: Optional[str]) -> List[Dict[str, Any]]:
    """GPUs the NVIDIA driver could not initialise, one entry per PCI bus id (field case 38).

    The driver names the GPU by bus id when it gives up (``NVRM: GPU 0000:01:00.0: RmInitAdapter
    failed! (0x62:0x40:2168)``, ``rm_init_adapter failed, device minor number 0``) and, before that,
    says why by its own GPU instance name (``NVRM: GPU0 _kgspBootGspRm: unexpected WPR2 already up,
    cannot proceed with booting GSP`` / ``(the GPU is likely in a bad state and may need to be
    reset)`` / ``RmInitAdapter: Cannot initialize GSP firmware RM``), or, on earlier branches, with
    no GPU name at all (``NVRM: _kgspBootGspRm: unexpected WPR2 already up, ...``). The causes printed since the
    previous failure are given to the next failure named by bus id. Such a GPU is missing from
    NVML and nvidia-smi ("No devices were found"); it needs a reset, in practice a cold reboot or
    power cycle of the node since it never initialised. The ``(0x62:0x40:2168)`` code is kept
    as printed, not decoded.

    :param text: kernel log text, or ``None``.
    :returns: ``[{"kind": "gpu_init_failed", "pci_bus_id": "0000:01:00.0", "time": float | str |
        None (first failure), "count": int (failure lines), "code": str | None ("(0x62:0x40:2168)"),
        "device_minor": int | None, "gsp_boot_failed": bool, "reset_needed": bool (the driver said
        the GPU may need to be reset), "causes": [str] (at most 4), "message": str,
        "first_line": str}]`` in the order of the first failure.
    :raises: nothing.
    Source: NVIDIA kernel driver (NVRM) messages quoted in NVIDIA/open-gpu-kernel-modules issues
    1058, 1104 and 1230.
    """
    found = {}  # type: Dict[str, Dict[str, Any]]
    pending = []  # type: List[str]
    for line in (text or "").splitlines():
        lower = line.lower()
        if "nvrm" not in lower or ("init" not in lower and "gsp" not in lower and "assert" not in lower):
            continue
        mono, wall, message = split_line(line)
        cause = _INIT_CAUSE.search(message)
        if cause:
            what = cause.group("what").strip()
            if what not in pending:
                pending.append(what)
            continue
        match = _INIT_FAILED.search(message)
        if not match:
            continue
        bus = normalize_pci_bus_id(match.group("bus")) or match.group("bus").lower()
        entry = found.get(bus)
        if entry is None:
            entry = found[bus] = {
                "kind": "gpu_init_failed", "pci_bus_id": bus, "time": mono if mono is not None else wall,
                "count": 0, "code": None, "device_minor": None, "gsp_boot_failed": False,
                "reset_needed": False, "causes": [], "message": None, "first_line": line.strip()[:1024],
            }
        entry["count"] += 1
        if match.group("code"):
            entry["code"] = match.group("code")
        if match.group("minor"):
            entry["device_minor"] = int(match.group("minor"))
        for what in pending:
            if what not in entry["causes"] and len(entry["causes"]) < 4:
                entry["causes"].append(what)
            if "GSP" in what or "WPR2" in what:
                entry["gsp_boot_failed"] = True
            if "may need to be reset" in what:
                entry["reset_needed"] = True
        pending = []
    for entry in found.values():
        why = "GSP firmware did not boot" if entry["gsp_boot_failed"] else "the driver could not initialise it"
        entry["message"] = "GPU %s failed to initialise (RmInitAdapter failed%s): %s" % (
            entry["pci_bus_id"], " %s" % entry["code"] if entry["code"] else "", why)
    return list(found.values())


def probe_failures(text: Optional[str]) -> List[Dict[str, Any]]:
    """GPUs the loaded driver refused to drive at probe time, one entry per GPU.

    The driver prints, over several ``NVRM:`` lines: ``The NVIDIA GPU 0000:3b:00.0 (PCI ID:
    10de:1db4)`` / ``installed in this system is not supported by the`` / ``NVIDIA 620.70.06 driver
    release.`` (a branch that dropped the architecture); ``... is not supported by open nvidia.ko
    because it does not include the required GPU System Processor (GSP).`` (open modules before
    Turing); ``... requires use of the NVIDIA open kernel modules.`` (Blackwell and later with the
    proprietary flavour); ``The NVIDIA <name> GPU installed in this system is supported through
    the NVIDIA 580.xx Legacy drivers.`` Then ``The NVIDIA probe routine failed for N device(s).``

    :param text: kernel log text, or ``None``.
    :returns: ``[{"pci_bus_id": str | None (the legacy message names the model, not the bus),
        "pci_id": str | None, "gpu_name": str | None, "reason": "not_supported" |
        "open_unsupported" | "open_required" | "legacy", "legacy_branch": str | None ("580.xx"),
        "first_line": str}]``.
    :raises: nothing.
    Source: the NVIDIA kernel module's probe messages (nv.c, "is not supported by"), as printed by
    the R580 and later drivers for GPUs outside their support list.
    """
    found = []  # type: List[Dict[str, Any]]
    current = None  # type: Optional[Dict[str, Any]]
    for line in (text or "").splitlines():
        if "NVRM" not in line:
            continue
        _mono, _wall, message = split_line(line)
        match = _PROBE_GPU.search(message)
        legacy = None if match else _PROBE_LEGACY.search(message)
        if match or legacy:
            current = {"pci_bus_id": normalize_pci_bus_id(match.group("bus")) if match else None,
                       "pci_id": match.group("pci_id") if match else None,
                       "gpu_name": legacy.group("name") if legacy else None,
                       "reason": "not_supported", "legacy_branch": None, "first_line": line.strip()[:1024]}
            found.append(current)
            if legacy is None:
                continue
        if current is None:
            continue
        if "by open" in message or "GSP" in message:
            current["reason"] = "open_unsupported"
        elif "requires use of the NVIDIA open" in message:
            current["reason"] = "open_required"
        branch = re.search(r"supported through the NVIDIA (\S+) Legacy drivers", message)
        if branch:
            current["reason"], current["legacy_branch"] = "legacy", branch.group(1)
    return found


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
