# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``nvidia-smi``'s failure messages say, in NVML's and our outcome words.

Two kinds of message, both printed as text and both misleading when read naively:

* :func:`nvml_error_from_text` / :func:`parse_nvidia_smi_error`: ``nvidia-smi`` could not start
  NVML at all (``Failed to initialize NVML: Driver/library version mismatch``); the answer is
  the NVML return code's name (``nvml_names.RETURN_CODES``), evidence for ``driver.state``.
* :func:`classify_smi_output`: a setter or reset run (``-pl``, ``-pm``, ``-e``, ``-c``, ``-mig``,
  ``-r``) that failed for some GPUs, even when it ends in "All done." (field case 14); the answer
  is a setter outcome word (``setter_outcome.ERROR_OUTCOMES``) per GPU.

Pure: text in, dictionaries out. Texts as printed by drivers 3xx-5xx (field cases 13, 14, 15, 17).

Compatible with Python 3.7 (the managed nodes' floor, see README.md); standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import VERSION_IN_TEXT
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_names import (
    ERROR_DRIVER_NOT_LOADED,
    ERROR_GPU_IS_LOST,
    ERROR_LIB_RM_VERSION_MISMATCH,
    ERROR_LIBRARY_NOT_FOUND,
    ERROR_NO_PERMISSION,
    ERROR_UNKNOWN,
    RETURN_CODES,
)


# nvidia-smi prints these when nvmlInit fails (texts as printed by drivers 3xx-5xx).
_NVIDIA_SMI_ERRORS = (
    ("Driver/library version mismatch", RETURN_CODES[ERROR_LIB_RM_VERSION_MISMATCH]),
    ("couldn't communicate with the NVIDIA driver", RETURN_CODES[ERROR_DRIVER_NOT_LOADED]),
    ("couldn't find libnvidia-ml.so", RETURN_CODES[ERROR_LIBRARY_NOT_FOUND]),
    ("Failed to initialize NVML: Insufficient Permissions", RETURN_CODES[ERROR_NO_PERMISSION]),
    ("Failed to initialize NVML: Unknown Error", RETURN_CODES[ERROR_UNKNOWN]),
    ("GPU is lost", RETURN_CODES[ERROR_GPU_IS_LOST]),
)


def nvml_error_from_text(text: Optional[str]) -> Optional[str]:
    """Map an ``nvidia-smi`` failure message to the NVML error it reports.

    * ``Failed to initialize NVML: Driver/library version mismatch`` → ``"LibRmVersionMismatch"``
    * ``NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver`` →
      ``"DriverNotLoaded"``
    * ``NVIDIA-SMI couldn't find libnvidia-ml.so library in your system`` → ``"LibraryNotFound"``
    * ``Failed to initialize NVML: Insufficient Permissions`` → ``"NoPermission"``
    * ``Failed to initialize NVML: Unknown Error`` → ``"Unknown"``
    * ``... GPU is lost ...`` → ``"GpuIsLost"``

    The names are pynvml's exception names without ``NVMLError_`` (NVML ``nvmlReturn_t``).

    :returns: the error name, or ``None`` when the text holds none of these messages.
    :raises: nothing.
    """
    if not text:
        return None
    lowered = text.lower()
    for needle, name in _NVIDIA_SMI_ERRORS:
        if needle.lower() in lowered:
            return name
    return None


def parse_nvidia_smi_error(text: Optional[str]) -> Dict[str, Optional[str]]:
    """Parse an ``nvidia-smi`` failure: the NVML error and, on a version mismatch, the library version.

    On a mismatch ``nvidia-smi`` adds ``NVML library version: 595.71``: the userspace NVML
    library's version shortened to ``<branch>.<minor>`` (the patch level is not printed), so it is
    *not* an exact driver version and is not compared with ``driver_versions.versions_match``.

    :returns: ``{"nvml_error": str|None (see :func:`nvml_error_from_text`),
        "nvml_library_version_short": str|None, "message": str|None (the first error line)}``.
    :raises: nothing.
    """
    result = {"nvml_error": None, "nvml_library_version_short": None, "message": None}
    if not text:
        return result
    result["nvml_error"] = nvml_error_from_text(text)
    short = re.search(r"NVML library version:\s*(" + VERSION_IN_TEXT + ")", text)
    if short:
        result["nvml_library_version_short"] = short.group(1)
    for raw in text.splitlines():
        line = raw.strip()
        if line and nvml_error_from_text(line):
            result["message"] = line
            break
    return result


_NO_DEVICES = re.compile(r"^\s*(?:nvidia-smi:\s*)?No devices were found\s*$", re.IGNORECASE | re.MULTILINE)
_NO_HANDLE = re.compile(r"Unable to determine the device handle for (?:GPU\s*)?(?P<bus>[0-9A-Fa-f:.]+):\s*(?P<error>.+?)\s*$",
                        re.MULTILINE)


def parse_smi_answers(text: Optional[str]) -> Dict[str, Any]:
    """nvidia-smi's own answers when it prints no report: facts, not a file that cannot be read.

    * ``No devices were found``: NVML initialised and enumerated no GPU (a GPU that failed to
      initialise, field case 38; no GPU bound to the driver);
    * ``Unable to determine the device handle for GPU0000:91:00.0: Unknown Error``: that GPU is
      enumerated and cannot be opened (``nvmlDeviceGetHandleByIndex`` failed; field case 37, after
      Xid 79), while nvidia-smi goes on with the others.

    :param text: what nvidia-smi printed, or ``None``.
    :returns: ``{"no_devices": bool, "unreadable": [{"pci_bus_id": "0000:91:00.0", "error": "Unknown
        Error"}], "answered": bool (either was found)}``.
    :raises: nothing.
    """
    text = text or ""
    unreadable = []
    for match in _NO_HANDLE.finditer(text):
        bus = normalize_pci_bus_id(match.group("bus"))
        if bus:
            unreadable.append({"pci_bus_id": bus, "error": match.group("error")})
    no_devices = bool(_NO_DEVICES.search(text))
    return {"no_devices": no_devices, "unreadable": unreadable, "answered": no_devices or bool(unreadable)}


# nvidia-smi message shapes (field cases 13, 14, 15).
_SMI_LINE_RULES = (
    (re.compile(r"Insufficient Permissions", re.I), "no_permission"),
    (re.compile(r"\bnot supported\b", re.I), "unsupported"),
    (re.compile(r"In use by another client", re.I), "in_use"),
    (re.compile(r"not a valid power limit", re.I), "invalid_value"),
    (re.compile(r"GPU is lost", re.I), "gpu_lost"),
    (re.compile(r"Driver/library version mismatch", re.I), "driver_error"),
    (re.compile(r"reset required|requires (?:a )?reset", re.I), "reset_required"),
)
_SMI_BUS_ID = re.compile(r"\b((?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\b")
_SMI_RANGE = re.compile(r"between\s+([0-9.]+)\s*W\s+and\s+([0-9.]+)\s*W", re.I)


def classify_smi_output(text: str) -> List[Dict[str, Any]]:
    """Classify the per-GPU messages of an ``nvidia-smi`` setter or reset run.

    Each line that names a GPU by bus id and carries a known failure shape gives one entry; the
    tail "All done." is ignored, so a "not supported ... Treating as warning and moving on. All
    done." run is ``unsupported``, not success (field case 14). A reset refused with "In use by
    another client" is ``in_use`` (field case 13). A "not a valid power limit which should be
    between 200.00 W and 700.00 W" gives ``invalid_value`` with ``range_w`` (field case 15).

    :param text: stdout and stderr of ``nvidia-smi -pl``, ``-pm``, ``-e``, ``-c``, ``-mig`` or
        ``-r``.
    :returns: a list of ``{pci_bus_id, status, message, range_w}`` in the order found;
        ``pci_bus_id`` normalised to ``"0000:01:00.0"`` (4-digit domain, lower case) or ``None``
        when the line names no GPU; ``range_w`` is ``[min, max]`` as floats or ``None``.
    """
    found = []  # type: List[Dict[str, Any]]
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        status = None
        for pattern, outcome in _SMI_LINE_RULES:
            if pattern.search(line):
                status = outcome
                break
        if status is None:
            continue
        bus = _SMI_BUS_ID.search(line)
        bus_id = normalize_pci_bus_id(bus.group(1)) if bus else None
        span = _SMI_RANGE.search(line)
        found.append({
            "pci_bus_id": bus_id,
            "status": status,
            "message": line,
            "range_w": [float(span.group(1)), float(span.group(2))] if span else None,
        })
    return found
