# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fault injection into a node's GPU state (pure: takes and returns the state dict).

Kinds (``args`` is a dict, or a list of ``key=value`` / positional strings from a command line):

- ``build_fail``: ``version`` (or ``*`` for every version). The kernel-module packages'
  maintainer scripts fail to "build" that version (exit 10, package left half-configured).
- ``gpu_lost``: ``gpu`` (physical index), ``when`` = ``next_boot`` (default) | ``now``. The GPU
  falls off the bus: Xid 79 in the kernel log of that boot, NVML raises GpuIsLost for it and
  nvidia-smi cannot get its handle; after the following reboot it is absent from the bus
  (NVML count and nvidia-smi are one GPU short), until ``clear``.
- ``xid_storm``: ``xid``, ``count`` (default 10), ``gpu`` (index or ``all``, default 0):
  that many Xid lines appended to the current boot's kernel log.
- ``nvml_not_supported``: ``field`` (one of :data:`FIELDS`), ``gpu`` (index or ``all``, default
  ``all``): NVML raises NotSupported for that field, nvidia-smi prints N/A.
- ``version_mismatch``: ``loaded_version`` (optional). From the next boot on, the loaded
  module is that version (default: a version of the same branch other than the one on disk),
  so NVML init fails with LibRmVersionMismatch while userspace stays as installed.
- ``gpu_busy``: ``gpu`` (index or ``all``), ``count`` (default 1): compute processes run on the
  GPU (until the next boot): MIG mode changes raise InUse, ``nvidia-smi -r`` is refused.
- ``contract_outlier``: ``field`` (one of :data:`OUTLIER_FIELDS`), ``value``, ``version``
  (optional, default every version), ``gpu`` (index or ``all``, default ``all``): from the next
  boot on, whenever that driver version is loaded, the GPU reports ``value`` for the field
  instead of its profile's (a driver that misbehaves on some nodes only: a lower maximum SM
  clock, more reserved memory, a narrower PCIe link).
- ``gpu_replaced``: ``gpu`` (physical index). The card in that slot is swapped for another of the
  same model (an RMA): from now on it is on the bus (a ``gpu_lost`` of that GPU is over) with a new
  UUID and serial; its bus id, name and everything else stay.
- ``clear``: ``kind`` (optional): remove every fault (or those of one kind); lost GPUs are back.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import catalog, klog

KINDS = ("build_fail", "gpu_lost", "xid_storm", "nvml_not_supported", "version_mismatch", "gpu_busy",
         "contract_outlier", "gpu_replaced", "clear")

_VERSION = re.compile(r"^\d+(\.\d+){1,3}$")

#: ``contract_outlier`` fields -> (state section, key) of a GPU.
OUTLIER_FIELDS: Dict[str, Tuple[str, str]] = {
    "max_sm": ("clocks", "max_sm"),
    "reserved_mib": ("memory", "reserved_mib"),
    "pcie_width": ("pcie", "width_max"),
}

#: Field names accepted by ``nvml_not_supported`` -> what they cover (NVML calls / nvidia-smi elements).
FIELDS: Dict[str, str] = {
    "power_limit": "nvmlDeviceGet/SetPowerManagementLimit, DefaultLimit, LimitConstraints, EnforcedPowerLimit",
    "power_usage": "nvmlDeviceGetPowerUsage, GetTotalEnergyConsumption",
    "persistence_mode": "nvmlDeviceGet/SetPersistenceMode",
    "compute_mode": "nvmlDeviceGet/SetComputeMode",
    "ecc_mode": "nvmlDeviceGet/SetEccMode",
    "ecc_errors": "nvmlDeviceGetTotalEccErrors, GetMemoryErrorCounter",
    "remapped_rows": "nvmlDeviceGetRemappedRows",
    "retired_pages": "nvmlDeviceGetRetiredPages(_v2), GetRetiredPagesPendingStatus",
    "mig_mode": "nvmlDeviceGet/SetMigMode",
    "clocks": "nvmlDeviceGetClockInfo, GetMaxClockInfo, GetApplicationsClock",
    "clocks_event_reasons": "nvmlDeviceGetCurrentClocksEventReasons (and ...ThrottleReasons)",
    "temperature": "nvmlDeviceGetTemperature(V), GetTemperatureThreshold",
    "pcie": "nvmlDeviceGetCurr/MaxPcieLinkGeneration/Width, GetGpuMaxPcieLinkGeneration",
    "utilization": "nvmlDeviceGetUtilizationRates",
    "memory": "nvmlDeviceGetMemoryInfo, GetBAR1MemoryInfo",
    "processes": "nvmlDeviceGetComputeRunningProcesses",
    "serial": "nvmlDeviceGetSerial",
    "vbios_version": "nvmlDeviceGetVbiosVersion",
    "performance_state": "nvmlDeviceGetPerformanceState",
}

_POSITIONAL = {
    "build_fail": ["version"],
    "gpu_lost": ["gpu", "when"],
    "xid_storm": ["xid", "count", "gpu"],
    "nvml_not_supported": ["field", "gpu"],
    "version_mismatch": ["loaded_version"],
    "gpu_busy": ["gpu", "count"],
    "contract_outlier": ["field", "value", "version", "gpu"],
    "gpu_replaced": ["gpu"],
    "clear": ["kind"],
}


def empty_faults() -> Dict[str, Any]:
    """The ``faults`` dict of a healthy node."""
    return {"build_fail": [], "gpu_lost": [], "version_mismatch": None, "contract_outlier": []}


def _normalize(kind: str, args: Union[None, Dict[str, Any], Sequence[str]]) -> Dict[str, Any]:
    if args is None:
        return {}
    if isinstance(args, dict):
        return dict(args)
    out: Dict[str, Any] = {}
    names = list(_POSITIONAL[kind])
    for item in args:
        if "=" in str(item):
            key, value = str(item).split("=", 1)
            out[key.strip()] = value.strip()
        elif names:
            out[names.pop(0)] = item
        else:
            raise ValueError("fault %s: unexpected argument %r" % (kind, item))
    return out


def _gpu_indexes(state: Dict[str, Any], value: Any, default: Any) -> List[int]:
    value = default if value in (None, "") else value
    count = len(state["gpus"])
    if str(value) == "all":
        return list(range(count))
    index = int(value)
    if not 0 <= index < count:
        raise ValueError("no GPU %d on this node (it has %d)" % (index, count))
    return [index]


def apply_fault(state: Dict[str, Any], kind: str, args: Union[None, Dict[str, Any], Sequence[str]] = None) -> Dict[str, Any]:
    """Apply one fault to ``state`` (changed in place and returned). Raises ValueError on bad input."""
    if kind not in KINDS:
        raise ValueError("unknown fault kind %r (known: %s)" % (kind, ", ".join(KINDS)))
    opts = _normalize(kind, args)
    faults = state.setdefault("faults", empty_faults())
    for key, value in empty_faults().items():
        faults.setdefault(key, value)

    if kind == "build_fail":
        version = str(opts.get("version") or "*")
        if version == "all":
            version = "*"
        if version not in faults["build_fail"]:
            faults["build_fail"].append(version)
    elif kind == "gpu_lost":
        when = str(opts.get("when") or "next_boot")
        if when not in ("next_boot", "now"):
            raise ValueError("gpu_lost: when must be next_boot or now, not %r" % when)
        for index in _gpu_indexes(state, opts.get("gpu"), 0):
            gpu = state["gpus"][index]
            if when == "now":
                if gpu.get("bus_state", "ok") == "ok":
                    gpu["bus_state"] = "lost"
                    for line in klog.xid_lines(gpu, 79, catalog.XID_TEXT[79][0]):
                        klog.append(state, line)
            elif index not in [entry["gpu"] for entry in faults["gpu_lost"]]:
                faults["gpu_lost"].append({"gpu": index})
    elif kind == "gpu_replaced":
        if opts.get("gpu") in (None, "", "all"):
            raise ValueError("gpu_replaced needs the index of one GPU")
        for index in _gpu_indexes(state, opts.get("gpu"), 0):
            gpu = state["gpus"][index]
            gpu["bus_state"] = "ok"
            faults["gpu_lost"] = [entry for entry in faults["gpu_lost"] if entry["gpu"] != index]
            gpu["uuid"] = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, "%s/replaced" % gpu["uuid"]))
            serial = str(gpu.get("serial") or "")
            gpu["serial"] = ("%0*d" % (len(serial), (int(serial) + 7919) % 10 ** len(serial))
                             if serial.isdigit() else serial + "R")
    elif kind == "xid_storm":
        xid = int(opts.get("xid") or 0)
        if xid <= 0:
            raise ValueError("xid_storm needs an xid code")
        count = int(opts.get("count") or 10)
        text, process = catalog.XID_TEXT.get(xid, ("Unknown Error", None))
        for index in _gpu_indexes(state, opts.get("gpu"), 0):
            gpu = state["gpus"][index]
            for n in range(count):
                pid = 4000 + 17 * n if process else None
                for line in klog.xid_lines(gpu, xid, text, pid=pid, process=process):
                    klog.append(state, line)
    elif kind == "nvml_not_supported":
        field = str(opts.get("field") or "")
        if field not in FIELDS:
            raise ValueError("nvml_not_supported: unknown field %r (known: %s)" % (field, ", ".join(sorted(FIELDS))))
        for index in _gpu_indexes(state, opts.get("gpu"), "all"):
            listed = state["gpus"][index].setdefault("not_supported", [])
            if field not in listed:
                listed.append(field)
    elif kind == "version_mismatch":
        faults["version_mismatch"] = {"loaded_version": opts.get("loaded_version") or None}
    elif kind == "gpu_busy":
        count = int(opts.get("count") or 1)
        for index in _gpu_indexes(state, opts.get("gpu"), "all"):
            procs = state["gpus"][index].setdefault("processes", [])
            for n in range(count):
                procs.append({"pid": 31000 + 100 * index + len(procs) + n, "name": "python3",
                              "used_mib": 1024, "gpu_instance_id": None, "compute_instance_id": None})
    elif kind == "contract_outlier":
        unknown = sorted(set(opts) - set(_POSITIONAL[kind]))
        if unknown:
            raise ValueError("contract_outlier: unknown argument %s (known: %s)"
                             % (", ".join(unknown), ", ".join(_POSITIONAL[kind])))
        field = str(opts.get("field") or "")
        if field not in OUTLIER_FIELDS:
            raise ValueError("contract_outlier: unknown field %r (known: %s)" % (field, ", ".join(sorted(OUTLIER_FIELDS))))
        raw = opts.get("value")
        if isinstance(raw, bool) or not str(raw).strip().isdigit() or not 0 < int(str(raw).strip()) <= 1000000:
            raise ValueError("contract_outlier: value must be a whole number from 1 to 1000000, not %r" % (raw,))
        version = opts.get("version")
        if version not in (None, "") and not (isinstance(version, str) and _VERSION.match(version)):
            raise ValueError("contract_outlier: version must be a driver version such as 620.82.01, not %r" % (version,))
        try:
            gpus = _gpu_indexes(state, opts.get("gpu"), "all")
        except (TypeError, ValueError) as exc:
            raise ValueError("contract_outlier: gpu must be a GPU index or all, not %r (%s)" % (opts.get("gpu"), exc))
        faults["contract_outlier"].append({"field": field, "value": int(str(raw).strip()), "version": version or None,
                                           "gpus": gpus})
    else:  # clear
        only: Optional[str] = opts.get("kind") or None
        if only and only not in KINDS:
            raise ValueError("clear: unknown kind %r" % only)
        if only in (None, "build_fail"):
            faults["build_fail"] = []
        if only in (None, "version_mismatch"):
            faults["version_mismatch"] = None
        if only in (None, "contract_outlier"):
            faults["contract_outlier"] = []
        if only in (None, "gpu_lost"):
            faults["gpu_lost"] = []
            for gpu in state["gpus"]:
                gpu["bus_state"] = "ok"
        if only in (None, "nvml_not_supported"):
            for gpu in state["gpus"]:
                gpu["not_supported"] = []
        if only in (None, "gpu_busy"):
            for gpu in state["gpus"]:
                gpu["processes"] = []
    return state


def apply_driver_contract(state: Dict[str, Any], gpus: Sequence[Dict[str, Any]], version: str) -> None:
    """Set what the loaded driver ``version`` makes of each driven GPU's contract (at boot).

    The profile's values are kept under ``contract_base`` the first time; the driver's offsets
    (:func:`catalog.contract_offsets`) apply to them, then the ``contract_outlier`` faults that
    match ``version``.
    """
    offsets = catalog.contract_offsets(version)
    outliers = [entry for entry in (state.get("faults") or {}).get("contract_outlier") or []
                if entry.get("version") in (None, version)]
    for gpu in gpus:
        base = gpu.setdefault("contract_base", {"reserved_mib": gpu["memory"]["reserved_mib"],
                                                "app_graphics": gpu["clocks"]["app_graphics"],
                                                "max_sm": gpu["clocks"]["max_sm"],
                                                "width_max": gpu["pcie"]["width_max"]})
        gpu["memory"]["reserved_mib"] = int(base["reserved_mib"]) + offsets["reserved_mib"]
        gpu["clocks"]["app_graphics"] = int(base["app_graphics"]) + offsets["app_graphics_mhz"]
        gpu["clocks"]["max_sm"] = base["max_sm"]
        gpu["pcie"]["width_max"] = base["width_max"]
        for entry in outliers:
            if gpu["index"] in entry.get("gpus", ()):
                section, key = OUTLIER_FIELDS[entry["field"]]
                gpu[section][key] = int(entry["value"])
