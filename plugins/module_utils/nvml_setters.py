# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Classify what a GPU setter did, from its error and from reading the value back.

A setter's own answer is never trusted on its own: ``nvidia-smi -pl`` prints "All done." after
"not supported ... Treating as warning and moving on." (field case 14), and an NVML setter that
returns success may leave the enforced value elsewhere (field case 15). So a result is built from
three facts: the value before, the value read back after, and the NVML error (if any). ``changed``
is true only when the read-back moved.

Outcomes (``status`` of a result):

``ok``             already as wanted, nothing was called.
``applied``        the setter ran and the read-back equals the wanted value.
``pending_reboot`` the read-back shows the wanted value as *pending* (ECC mode): in effect after a reboot.
``pending_reset``  the read-back shows the wanted value as *pending* until a GPU reset (MIG mode).
``not_in_effect``  the requested value reads back as wanted, but the enforced value differs (power limit).
``unsupported``    NVML ``NotSupported``/``FunctionNotFound``: not available on this GPU; skipped.
``no_permission``  NVML ``NoPermission`` ("Insufficient Permissions"): needs root / ``CAP_SYS_ADMIN``.
``in_use``         NVML ``InUse``: a process or another client holds the GPU.
``invalid_value``  NVML ``InvalidArgument``: the value is outside what the GPU accepts.
``reset_required`` NVML ``ResetRequired``: the GPU must be reset before it takes the setting.
``gpu_lost``       NVML ``GpuIsLost``.
``driver_error``   NVML ``DriverNotLoaded``/``LibRmVersionMismatch``/``Uninitialized``.
``failed``         any other error, or no error but the read-back did not reach the wanted value.

Error codes: nvml.h ``nvmlReturn_t`` (NVML API Reference Guide, "Error reporting"); message
texts: ``nvmlErrorString`` as printed by ``nvidia-smi`` (field cases 13, 14, 15).

Functions whose purpose is I/O say so; the rest are pure.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_policy_plan import (
    COMPUTE_MODES,
    diff_value,
    observed,
    policy_report,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_plan import current_layout, format_layout
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_names import return_code_name
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import error_name, read_gpu

# NVML error name (as nvml_reader.error_name gives it) → outcome.
ERROR_OUTCOMES = {
    "NotSupported": "unsupported",
    "FunctionNotFound": "unsupported",
    "Deprecated": "unsupported",
    "NoPermission": "no_permission",
    "InUse": "in_use",
    "InvalidArgument": "invalid_value",
    "ResetRequired": "reset_required",
    "GpuIsLost": "gpu_lost",
    "DriverNotLoaded": "driver_error",
    "LibRmVersionMismatch": "driver_error",
    "Uninitialized": "driver_error",
    "LibraryNotFound": "driver_error",
}

# Outcomes after which the value on the GPU is as the policy wants it (now or once pending).
GOOD_OUTCOMES = ("ok", "applied", "pending_reboot", "pending_reset")

# Outcomes that stop a run: retrying another GPU cannot help until the cause is fixed.
FATAL_OUTCOMES = ("no_permission", "driver_error")

# CAP_SYS_ADMIN is capability number 21 (linux/capability.h).
CAP_SYS_ADMIN = 21


def outcome_of_error(name: Optional[str]) -> Optional[str]:
    """Map an NVML error name (``"NoPermission"``) to an outcome (``"no_permission"``).

    :param name: the name of the NVML return code as ``nvml_reader.error_name`` gives it, or
        ``None`` for success.
    :returns: the outcome, ``None`` for ``None``, ``"failed"`` for any name not in
        :data:`ERROR_OUTCOMES`.
    """
    if name is None:
        return None
    return ERROR_OUTCOMES.get(name, "failed")


def _same(left: Any, right: Any) -> bool:
    if isinstance(left, float) or isinstance(right, float):
        if left is None or right is None:
            return False
        return int(round(float(left) * 1000)) == int(round(float(right) * 1000))
    if isinstance(left, str) and isinstance(right, str):
        return left.lower() == right.lower()
    return left == right


def setter_result(
    setting: str,
    wanted: Any,
    before: Any,
    after: Any,
    error: Optional[str] = None,
    called: bool = True,
    current_after: Any = None,
    pending_requires: Optional[str] = None,
    enforced_after: Any = None,
) -> Dict[str, Any]:
    """Build the result of one setting on one GPU from before, read-back and error.

    :param setting: ``"power_limit_w"``, ``"persistence_mode"``, ``"ecc_mode"``,
        ``"compute_mode"`` or ``"mig_mode"``.
    :param wanted: the value the policy asks for (watts as ``float``, ``bool``, or a mode name).
    :param before: the value read before the setter (for ECC/MIG: the *pending* value).
    :param after: the value read back after the setter (same kind as ``before``); ``None`` when it
        could not be read.
    :param error: NVML error name raised by the setter, or ``None``.
    :param called: ``False`` when no setter was called (already as wanted).
    :param current_after: for settings with current/pending values, the *current* value read back;
        when ``after`` (pending) equals ``wanted`` but this differs, the result is pending.
    :param pending_requires: ``"reboot"`` (ECC) or ``"reset"`` (MIG) for the pending case.
    :param enforced_after: for the power limit, the enforced limit read back (watts); when it differs
        from ``wanted`` the result is ``not_in_effect`` (field case 15).
    :returns: ``{setting, wanted, before, after, status, changed, message}``. ``changed`` is true
        only when ``after`` differs from ``before`` (the read-back moved), whatever the setter said.
    """
    changed = called and after is not None and not _same(before, after)
    result = {
        "setting": setting,
        "wanted": wanted,
        "before": before,
        "after": after,
        "changed": bool(changed),
        "status": None,
        "message": "",
    }
    outcome = outcome_of_error(error)
    if outcome is not None:
        result["status"] = outcome
        result["message"] = "%s: NVML %s" % (setting, error)
        return result
    if after is None and called:
        result["status"] = "failed"
        result["message"] = "%s: the value could not be read back after setting it" % setting
        return result
    if not _same(after, wanted):
        result["status"] = "failed"
        result["message"] = "%s: the setter reported success but reads back %r, not %r" % (setting, after, wanted)
        return result
    if pending_requires is not None and current_after is not None and not _same(current_after, wanted):
        result["status"] = "pending_%s" % pending_requires
        result["message"] = "%s: %r is pending; in effect after a %s (current %r)" % (
            setting, wanted, "reboot" if pending_requires == "reboot" else "GPU reset", current_after)
        return result
    if enforced_after is not None and not _same(enforced_after, wanted):
        result["status"] = "not_in_effect"
        result["message"] = (
            "%s: requested %s W reads back, but the enforced limit is %s W; another limiter "
            "(out-of-band/BMC cap, module or board power limit) holds it lower" % (setting, wanted, enforced_after))
        return result
    result["status"] = "applied" if called else "ok"
    return result


def call_setter(nvml: Any, func_name: str, *args: Any) -> Optional[str]:
    """Call one NVML setter and return the name of its error, or ``None`` on success. Does NVML I/O.

    :param nvml: the pynvml module (initialised).
    :param func_name: e.g. ``"nvmlDeviceSetPowerManagementLimit"``.
    :param args: the setter's arguments (handle first).
    :returns: ``None`` on success, else the NVML error name (``"NoPermission"``, ``"NotSupported"``,
        ``"InUse"``, ...); a function this pynvml lacks gives ``"FunctionNotFound"``.
    :raises: exceptions that are no NVML error propagate.
    """
    base = getattr(nvml, "NVMLError", None)
    try:
        func = getattr(nvml, func_name)
    except AttributeError:
        return "FunctionNotFound"
    try:
        func(*args)
    except Exception as err:  # pylint: disable=broad-except
        if base is not None and isinstance(err, base):
            return _error_name(nvml, err)
        raise
    return None


def cap_effective_has(status_text: Optional[str], capability: int = CAP_SYS_ADMIN) -> Optional[bool]:
    """Tell from ``/proc/self/status`` whether the process holds a capability.

    :param status_text: the content of ``/proc/self/status`` (its ``CapEff:`` line is a hex mask).
    :param capability: the capability number, default ``CAP_SYS_ADMIN`` (21, linux/capability.h).
    :returns: ``True``/``False``, or ``None`` when the text has no ``CapEff:`` line.
    """
    if not status_text:
        return None
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", status_text, re.MULTILINE)
    if not match:
        return None
    return bool(int(match.group(1), 16) & (1 << capability))


def in_container(cgroup_text: Optional[str] = None, marker_files: Optional[List[str]] = None,
                 container_env: Optional[str] = None) -> bool:
    """Tell whether the process runs in a container, from evidence the caller read.

    :param cgroup_text: the content of ``/proc/1/cgroup`` (docker/kubepods/containerd/lxc paths).
    :param marker_files: the marker files that exist (``/.dockerenv``, ``/run/.containerenv``).
    :param container_env: the ``container`` environment variable of PID 1 (systemd convention:
        ``docker``, ``podman``, ``lxc``, ``systemd-nspawn``).
    :returns: ``True`` when any evidence says container.
    """
    if marker_files:
        return True
    if container_env:
        return True
    if cgroup_text and re.search(r"docker|kubepods|containerd|libpod|/lxc/", cgroup_text):
        return True
    return False


def permission_message(what: str, euid: int, container: bool, cap_sys_admin: Optional[bool]) -> str:
    """Say what is missing when NVML answered NoPermission ("Insufficient Permissions").

    :param what: what was being set, e.g. ``"the power limit of GPU 0 (0000:18:00.0)"``.
    :param euid: the effective user id of the module.
    :param container: whether the module runs in a container (see :func:`in_container`).
    :param cap_sys_admin: whether ``CAP_SYS_ADMIN`` is in the effective set (see
        :func:`cap_effective_has`), ``None`` when unknown.
    :returns: one sentence: not root → run as root (``become: true``); root in a container without
        ``CAP_SYS_ADMIN`` → start the container with ``--cap-add=SYS_ADMIN`` or run on the host
        (field case 14: nvidia-docker issue 495); otherwise the GPU's or driver's own restriction.
    """
    if euid != 0:
        return ("NVML refused to set %s: Insufficient Permissions. Setting GPU policy needs root: "
                "run the task with become: true (the module ran as uid %d)." % (what, euid))
    if container or cap_sys_admin is False:
        return ("NVML refused to set %s: Insufficient Permissions although the module runs as root%s. "
                "Root in a container is not enough: the container needs CAP_SYS_ADMIN "
                "(--cap-add=SYS_ADMIN, or securityContext.capabilities.add: [SYS_ADMIN]), "
                "or run the task on the host." % (what, " in a container" if container else " without CAP_SYS_ADMIN"))
    return ("NVML refused to set %s: Insufficient Permissions although the module runs as root with "
            "CAP_SYS_ADMIN. The setting may be locked (for example by a hypervisor in a virtual machine "
            "or by the board's out-of-band management)." % what)


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


def assess_policy(plan: Dict[str, Any], after_gpus: List[Dict[str, Any]],
                  errors: Dict[str, Optional[str]]) -> Dict[str, Any]:
    """Judge what a run did, from the plan, the setters' errors and the values read back.

    ``changed`` comes from the read-back only (``nvml_setters.setter_result``): a setter that
    reported success while the value did not move is ``failed``, never ``changed``.

    :param plan: the result of :func:`plan_policy`.
    :param after_gpus: the node's GPU records read after the setters ran.
    :param errors: ``{"<index>/<setting>": NVML error name or None}`` as
        ``nvml_setters.apply_policy_plan`` returns it; a planned change with no key was not
        attempted (the run stopped before it).
    :returns: ``{"gpus": [{index, uuid, pci_bus_id, name, results: [setter result + index],
        changed, report}], "changed": bool, "results": [all results], "reset_required": bool,
        "reboot_required": bool}``; ``report`` is :func:`policy_report` of the read-back.
    """
    by_index = {gpu.get("index"): gpu for gpu in after_gpus}
    gpus = []
    everything = []
    for gpu_plan in plan["gpus"]:
        index = gpu_plan["index"]
        gpu_after = by_index.get(index) or {"power": {}, "ecc": {}, "index": index}
        seen = observed(gpu_after)
        results = []
        changed_settings = set()
        for change in gpu_plan["changes"]:
            setting = change["setting"]
            changed_settings.add(setting)
            key = "%s/%s" % (index, setting)
            if key not in errors:
                result = {"setting": setting, "wanted": change["after"], "before": change["before"],
                          "after": diff_value(seen, setting), "changed": False, "status": "not_attempted",
                          "message": "%s: not attempted, the run stopped at an earlier error" % setting}
            elif setting == "power_limit_w":
                result = setter_result(setting, change["after"], change["before"], seen["power_limit_w"],
                                       error=errors[key], enforced_after=seen["enforced_power_limit_w"])
            elif setting == "ecc_mode":
                result = setter_result(setting, change["after"], change["before"], diff_value(seen, setting),
                                       error=errors[key], current_after=seen["ecc_mode"], pending_requires="reboot")
            else:
                result = setter_result(setting, change["after"], change["before"], seen[setting], error=errors[key])
            results.append(result)
        for setting in gpu_plan["wanted"]:
            if setting not in changed_settings:
                results.append(unchanged_result(gpu_plan, setting, seen))
        for result in results:
            result["index"] = index
        everything.extend(results)
        report = policy_report(plan["policy"], gpu_after) if by_index.get(index) else None
        gpus.append({
            "index": index,
            "uuid": gpu_plan["uuid"],
            "pci_bus_id": gpu_plan["pci_bus_id"],
            "name": gpu_plan["name"],
            "results": results,
            "changed": any(result["changed"] for result in results),
            "report": report,
        })
    return {
        "gpus": gpus,
        "results": everything,
        "changed": any(gpu["changed"] for gpu in gpus),
        "reset_required": any(gpu["report"] and gpu["report"]["reset_required"] for gpu in gpus),
        "reboot_required": any(gpu["report"] and (gpu["report"]["reboot_required"] or gpu["report"]["pending"])
                               for gpu in gpus),
    }


def unchanged_result(gpu_plan: Dict[str, Any], setting: str, seen: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The result of a managed setting the plan did not change on this GPU.

    :param gpu_plan: one GPU of ``gpu_policy_plan.plan_policy``.
    :param setting: a key of ``gpu_plan["wanted"]`` that has no change.
    :param seen: ``gpu_policy_plan.observed`` of the GPU read back, or ``None`` to use the plan's
        ``before``.
    :returns: a result shaped like :func:`setter_result`, ``changed`` false, ``status``
        ``unsupported`` (skipped), ``not_in_effect`` (requested but not enforced: field case 15),
        ``pending_reboot`` (already pending) or ``ok``.
    """
    value = gpu_plan["wanted"][setting]
    if setting in gpu_plan["unsupported"]:
        status, message = "unsupported", "%s: not supported on this GPU; skipped" % setting
    elif any(entry["setting"] == setting for entry in gpu_plan["not_in_effect"]):
        status = "not_in_effect"
        message = "%s: %s" % (setting, [entry for entry in gpu_plan["not_in_effect"]
                                        if entry["setting"] == setting][0]["reason"])
    elif any(entry["setting"] == setting for entry in gpu_plan["pending"]):
        status, message = "pending_reboot", "%s: already pending; in effect after the next reboot" % setting
    else:
        status, message = "ok", ""
    return {"setting": setting, "wanted": value, "before": diff_value(gpu_plan["before"], setting),
            "after": diff_value(seen if seen is not None else gpu_plan["before"], setting), "changed": False,
            "status": status, "message": message}


def planned_results(gpu_plan: Dict[str, Any], check_mode: bool) -> List[Dict[str, Any]]:
    """Results for a GPU when nothing was applied (check mode, or nothing to change).

    :returns: one result per managed setting: ``would_change`` for each planned change in check
        mode, else :func:`unchanged_result`; each with ``index``.
    """
    results = []
    changing = dict((change["setting"], change) for change in gpu_plan["changes"])
    for setting in gpu_plan["wanted"]:
        if setting in changing:
            change = changing[setting]
            result = {"setting": setting, "wanted": change["after"], "before": change["before"],
                      "after": change["before"], "changed": False,
                      "status": "would_change" if check_mode else "not_attempted",
                      "message": "%s: %s -> %s (%s)" % (setting, change["before"], change["after"], change["effect"])}
        else:
            result = unchanged_result(gpu_plan, setting)
        result["index"] = gpu_plan["index"]
        results.append(result)
    return results


# ---------------------------------------------------------------------------------------------
# NVML I/O: the functions below call NVML (they take the pynvml module as their first argument).
# ---------------------------------------------------------------------------------------------

# GPU-instance slice count → NVML_COMPUTE_INSTANCE_PROFILE_* (nvml.h): a MIG device as mig-parted
# makes it is one compute instance spanning its whole GPU instance.
_CI_PROFILE_BY_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


def _nvml_error(nvml: Any, err: BaseException) -> Optional[str]:
    base = getattr(nvml, "NVMLError", None)
    if isinstance(err, AttributeError) or (base is not None and isinstance(err, base)):
        return _error_name(nvml, err)
    return None


def _error_name(nvml: Any, err: BaseException) -> str:
    """``nvml_reader.error_name``, completed by pynvml's own class name (``NVMLError_InsufficientResources``)."""
    name = error_name(nvml, err)
    if name.startswith("Error") and type(err).__name__.startswith("NVMLError_"):
        return type(err).__name__[len("NVMLError_"):]
    return name


def apply_change(nvml: Any, handle: Any, change: Dict[str, Any]) -> Optional[str]:
    """Call the NVML setter for one planned change. Does NVML I/O.

    :param nvml: the pynvml module (initialised).
    :param handle: the device handle (``nvmlDeviceGetHandleByIndex``).
    :param change: ``{setting, after}`` from ``gpu_policy_plan.plan_policy``.
    :returns: ``None`` on success, else the NVML error name.
    :raises ValueError: for a setting this function does not know.

    Setters: ``nvmlDeviceSetPowerManagementLimit`` (milliwatts), ``nvmlDeviceSetPersistenceMode``,
    ``nvmlDeviceSetEccMode``, ``nvmlDeviceSetComputeMode`` (NVML API Reference, "Device Commands").
    """
    setting, value = change["setting"], change["after"]
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    disabled = getattr(nvml, "NVML_FEATURE_DISABLED", 0)
    if setting == "power_limit_w":
        return call_setter(nvml, "nvmlDeviceSetPowerManagementLimit", handle, int(round(float(value) * 1000)))
    if setting == "persistence_mode":
        return call_setter(nvml, "nvmlDeviceSetPersistenceMode", handle, enabled if value else disabled)
    if setting == "ecc_mode":
        return call_setter(nvml, "nvmlDeviceSetEccMode", handle, enabled if value else disabled)
    if setting == "compute_mode":
        return call_setter(nvml, "nvmlDeviceSetComputeMode", handle, COMPUTE_MODES[value][0])
    raise ValueError("unknown setting %r" % (setting,))


def apply_policy_plan(nvml: Any, plan: Dict[str, Any], stop_on_fatal: bool = True) -> Dict[str, Any]:
    """Apply every change of a policy plan. Does NVML I/O.

    :param nvml: the pynvml module (initialised).
    :param plan: the result of ``gpu_policy_plan.plan_policy``.
    :param stop_on_fatal: stop at the first ``no_permission``/``driver_error`` (every further call
        would fail the same way).
    :returns: ``{"errors": {"<index>/<setting>": error name or None}, "stopped": str|None}``; a change
        not attempted after a stop has no key. ``stopped`` names the error that stopped the run.
    """
    errors = {}  # type: Dict[str, Optional[str]]
    for gpu_plan in plan["gpus"]:
        if not gpu_plan["changes"]:
            continue
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu_plan["index"])
        except Exception as err:  # pylint: disable=broad-except
            name = _nvml_error(nvml, err)
            if name is None:
                raise
            for change in gpu_plan["changes"]:
                errors["%s/%s" % (gpu_plan["index"], change["setting"])] = name
            continue
        for change in gpu_plan["changes"]:
            name = apply_change(nvml, handle, change)
            errors["%s/%s" % (gpu_plan["index"], change["setting"])] = name
            if stop_on_fatal and outcome_of_error(name) in FATAL_OUTCOMES:
                return {"errors": errors, "stopped": name}
    return {"errors": errors, "stopped": None}


def process_name(nvml: Any, pid: int, proc_root: str = "/proc") -> Optional[str]:
    """Name a process by pid. Does NVML and file I/O.

    :returns: ``nvmlSystemGetProcessName(pid)``, else the first line of ``/proc/<pid>/comm``, else
        ``None``.
    """
    try:
        name = nvml.nvmlSystemGetProcessName(pid)
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        if name:
            return str(name).strip().rsplit("/", 1)[-1] or None
    except Exception:  # pylint: disable=broad-except
        pass
    try:
        with open("%s/%d/comm" % (proc_root, int(pid)), "r") as handle:
            return handle.readline().strip() or None
    except (IOError, OSError, ValueError):
        return None


def name_processes(nvml: Any, gpus: List[Dict[str, Any]]) -> None:
    """Fill ``name`` of each entry of ``gpu["processes"]`` in place. Does NVML and file I/O (:func:`process_name`)."""
    for gpu in gpus:
        for proc in gpu.get("processes") or []:
            if not proc.get("name") and proc.get("pid") is not None:
                proc["name"] = process_name(nvml, proc["pid"])


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value or "").strip()


def _profile_name(info: Any) -> Optional[str]:
    name = _text(getattr(info, "name", ""))
    match = re.search(r"(\d+g\.\d+gb(?:\+[a-z0-9.]+)?)\s*$", name)
    if match:
        return match.group(1)
    slices = getattr(info, "sliceCount", None)
    memory = getattr(info, "memorySizeMB", None)
    if slices and memory:
        # profiles are named by compute slices and memory rounded up to whole GB (MIG User Guide)
        return "%dg.%dgb" % (slices, -(-int(memory) // 1024))
    return None


def read_mig_profiles(nvml: Any, handle: Any) -> List[Dict[str, Any]]:
    """Read the GPU-instance profiles a GPU offers. Does NVML I/O.

    Source: ``nvmlDeviceGetGpuInstanceProfileInfo`` for each ``NVML_GPU_INSTANCE_PROFILE_*``
    (``nvmlGpuInstanceProfileInfo_v2_t``: ``id``, ``sliceCount``, ``instanceCount``,
    ``memorySizeMB``, ``name`` such as ``"MIG 1g.10gb"``); profiles the GPU lacks answer
    NotSupported/InvalidArgument and are left out.

    :returns: ``[{name, id, profile, slice_count, instance_count, memory_mib}]`` (``profile`` is the
        ``NVML_GPU_INSTANCE_PROFILE_*`` value); ``[]`` for a GPU without MIG.
    """
    profiles = []  # type: List[Dict[str, Any]]
    seen = set()
    count = getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12)
    for profile in range(count):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except Exception as err:  # pylint: disable=broad-except
            if _nvml_error(nvml, err) is None:
                raise
            continue
        name = _profile_name(info)
        if name is None or getattr(info, "id", None) in seen:
            continue
        seen.add(info.id)
        profiles.append({
            "name": name,
            "id": int(info.id),
            "profile": profile,
            "slice_count": int(getattr(info, "sliceCount", 0) or 0),
            "instance_count": int(getattr(info, "instanceCount", 0) or 0),
            "memory_mib": int(getattr(info, "memorySizeMB", 0) or 0),
        })
    return profiles


def set_mig_mode(nvml: Any, handle: Any, enabled: bool) -> Dict[str, Optional[str]]:
    """Ask NVML for a MIG mode. Does NVML I/O.

    Source: ``nvmlDeviceSetMigMode(device, NVML_DEVICE_MIG_ENABLE|DISABLE, &activationStatus)``: the
    mode becomes *pending* and is activated by a GPU reset (or at boot) when the GPU is in use or
    the platform requires it; ``activationStatus`` tells why it was not activated at once.

    :returns: ``{"error": NVML error name or None, "activation": error name or None}``.
    """
    mode = getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1) if enabled else getattr(nvml, "NVML_DEVICE_MIG_DISABLE", 0)
    try:
        status = nvml.nvmlDeviceSetMigMode(handle, mode)
    except Exception as err:  # pylint: disable=broad-except
        name = _nvml_error(nvml, err)
        if name is None:
            raise
        return {"error": name, "activation": None}
    activation = None
    if isinstance(status, int) and status:
        activation = return_code_name(status)
    return {"error": None, "activation": activation}


def _probe(nvml: Any, func_name: str, parent: Any, ident: int) -> Any:
    try:
        return getattr(nvml, func_name)(parent, ident)
    except Exception as err:  # pylint: disable=broad-except
        if _nvml_error(nvml, err) is None:
            raise
        return None


def destroy_mig_instances(nvml: Any, handle: Any, max_id: int = 32) -> Dict[str, Any]:
    """Destroy every compute instance and GPU instance of a GPU. Does NVML I/O.

    GPU instances are found by id (``nvmlDeviceGetGpuInstanceById`` for ids 0..``max_id``-1,
    NotFound skipped), their compute instances likewise (``nvmlGpuInstanceGetComputeInstanceById``
    for ids 0..7); compute instances are destroyed first (``nvmlComputeInstanceDestroy``), then the
    GPU instance (``nvmlGpuInstanceDestroy``). NVML answers InUse when a process runs on one.

    :returns: ``{"destroyed": [gpu instance ids], "error": first NVML error name or None}``.
    """
    destroyed = []
    for gi_id in range(max_id):
        gpu_instance = _probe(nvml, "nvmlDeviceGetGpuInstanceById", handle, gi_id)
        if gpu_instance is None:
            continue
        for ci_id in range(8):
            compute_instance = _probe(nvml, "nvmlGpuInstanceGetComputeInstanceById", gpu_instance, ci_id)
            if compute_instance is None:
                continue
            error = call_setter(nvml, "nvmlComputeInstanceDestroy", compute_instance)
            if error:
                return {"destroyed": destroyed, "error": error}
        error = call_setter(nvml, "nvmlGpuInstanceDestroy", gpu_instance)
        if error:
            return {"destroyed": destroyed, "error": error}
        destroyed.append(gi_id)
    return {"destroyed": destroyed, "error": None}


def _orderings(names: List[str], limit: int = 24) -> List[List[str]]:
    """Distinct orders of a multiset of profile names, the given order first, at most ``limit``."""
    result = []  # type: List[List[str]]

    def walk(prefix: List[str], rest: List[str]) -> None:
        if len(result) >= limit:
            return
        if not rest:
            result.append(list(prefix))
            return
        used = set()
        for position, name in enumerate(rest):
            if name in used:
                continue
            used.add(name)
            walk(prefix + [name], rest[:position] + rest[position + 1:])

    walk([], names)
    return result


# NVML_ERROR_INSUFFICIENT_RESOURCES (23): no room for this GPU instance where the GPU would place it.
_PLACEMENT_ERRORS = ("InsufficientResources", "Error23")


def create_mig_layout(nvml: Any, handle: Any, layout: Dict[str, int],
                      profiles: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Create a MIG layout on a GPU that has MIG enabled and no instances. Does NVML I/O.

    Each profile × count becomes that many GPU instances (``nvmlDeviceCreateGpuInstance``), each with
    one compute instance of its full size (``nvmlGpuInstanceGetComputeInstanceProfileInfo`` +
    ``nvmlGpuInstanceCreateComputeInstance``), as mig-parted does. Larger profiles go first; when the
    GPU answers InsufficientResources (a placement conflict) everything created is destroyed and the
    next order is tried, up to 24 orders.

    :param layout: ``{profile name: count}``.
    :param profiles: the GPU's profiles (:func:`read_mig_profiles`).
    :returns: ``{"created": [profile names], "error": NVML error name or None, "tried": int}``.
    """
    by_name = {profile["name"]: profile for profile in profiles}
    names = []
    for name in sorted(layout, key=lambda item: (-by_name[item]["slice_count"], -by_name[item]["memory_mib"], item)):
        names.extend([name] * layout[name])
    engine = getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
    last_error = None
    tried = 0
    for order in _orderings(names):
        tried += 1
        created = []
        last_error = None
        for name in order:
            profile = by_name[name]
            try:
                gpu_instance = nvml.nvmlDeviceCreateGpuInstance(handle, profile["id"])
                ci_profile = _CI_PROFILE_BY_SLICES.get(profile["slice_count"], 0)
                info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, ci_profile, engine)
                nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, info.id)
            except Exception as err:  # pylint: disable=broad-except
                last_error = _nvml_error(nvml, err)
                if last_error is None:
                    raise
                break
            created.append(name)
        if last_error is None:
            return {"created": created, "error": None, "tried": tried}
        destroy_mig_instances(nvml, handle)
        if last_error not in _PLACEMENT_ERRORS:
            break
    return {"created": [], "error": last_error, "tried": tried}


_INIT_ERRORS = {
    "LibraryNotFound": "the NVML library (libnvidia-ml.so.1) was not found: the NVIDIA driver is not installed",
    "DriverNotLoaded": "the NVIDIA kernel module is not loaded (driver installed but not loaded, or no GPU "
                       "found): load it or reboot",
    "LibRmVersionMismatch": "Driver/library version mismatch: the NVIDIA libraries were upgraded but the loaded "
                            "kernel module is older; reboot the node to load the new module, then apply again",
    "NoPermission": "NVML refused access to the GPUs (Insufficient Permissions): run as root with access to "
                    "/dev/nvidia*",
}


def init_error_message(name: str) -> str:
    """Explain an ``nvmlInit`` failure and what to do.

    :param name: the NVML error name (``LibraryNotFound``, ``DriverNotLoaded``,
        ``LibRmVersionMismatch``, ``NoPermission``, ...).
    :returns: one sentence naming the cause and the remedy; unknown names are quoted as they are.
    """
    return "NVML could not start: %s" % _INIT_ERRORS.get(name, "NVML error %s" % name)


def run_with_nvml(module: Any, nvml: Any, body: Any) -> Dict[str, Any]:
    """Start NVML, run ``body(module, nvml)``, shut NVML down whatever happens, return its result.

    Shared by the modules that change GPUs (``gpu_policy``, ``gpu_mig``).

    :param module: the ``AnsibleModule``; its ``fail_json`` ends the run when pynvml is missing
        (``nvml`` is ``None``) or ``nvmlInit`` fails (message from :func:`init_error_message`,
        ``nvml_error`` = the NVML error name; an ``OSError`` from loading libnvidia-ml.so.1 is
        ``LibraryNotFound``).
    :param nvml: the pynvml module (``nvml_reader.load_pynvml()``) or ``None``.
    :param body: a callable ``(module, nvml) -> dict``, the module's result.
    :returns: what ``body`` returned. ``nvmlShutdown`` errors are ignored; ``body``'s are raised.
    """
    if nvml is None:
        module.fail_json(msg="The pynvml module (package nvidia-ml-py) is not installed for this Python on the "
                             "node; install it (pip install nvidia-ml-py, or the distribution's python3-pynvml).")
    try:
        nvml.nvmlInit()
    except Exception as err:  # pylint: disable=broad-except
        name = "LibraryNotFound" if isinstance(err, OSError) else error_name(nvml, err)
        module.fail_json(msg=init_error_message(name), nvml_error=name)
    try:
        return body(module, nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # pylint: disable=broad-except
            pass


def read_gpus(nvml: Any) -> Dict[str, Any]:
    """Read every GPU of the node through NVML (already initialised). Does NVML I/O.

    :returns: ``{"gpus": [facts-model GPU records, nvml_reader.read_gpu], "unsupported": [...],
        "error": NVML error name of nvmlDeviceGetCount or None}``; process names are filled
        (:func:`name_processes`).
    """
    unsupported = []  # type: List[Dict[str, Any]]
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception as err:  # pylint: disable=broad-except
        name = _nvml_error(nvml, err)
        if name is None:
            raise
        return {"gpus": [], "unsupported": unsupported, "error": name}
    gpus = [read_gpu(nvml, index, unsupported) for index in range(count)]
    name_processes(nvml, gpus)
    return {"gpus": gpus, "unsupported": unsupported, "error": None}


def _read_small(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as handle:
            return handle.read(65536).decode("utf-8", "replace")
    except (IOError, OSError):
        return None


def read_permission_context(proc_root: str = "/proc", root: str = "/") -> Dict[str, Any]:
    """Gather what :func:`permission_message` needs. Does file I/O.

    Reads ``/proc/self/status`` (``CapEff``), ``/proc/1/cgroup``, ``/proc/1/environ`` (the
    ``container=`` variable) and looks for ``/.dockerenv`` and ``/run/.containerenv``.

    :returns: ``{"euid": int, "container": bool, "cap_sys_admin": bool|None}``.
    """
    environ = _read_small(os.path.join(proc_root, "1", "environ")) or ""
    container_env = None
    for item in environ.split("\0"):
        if item.startswith("container="):
            container_env = item.split("=", 1)[1]
    markers = [path for path in (os.path.join(root, ".dockerenv"), os.path.join(root, "run", ".containerenv"))
               if os.path.exists(path)]
    return {
        "euid": os.geteuid(),
        "container": in_container(_read_small(os.path.join(proc_root, "1", "cgroup")), markers, container_env),
        "cap_sys_admin": cap_effective_has(_read_small(os.path.join(proc_root, "self", "status"))),
    }


def _mig_current(gpu: Dict[str, Any]) -> bool:
    return bool((gpu.get("mig") or {}).get("mode_current"))


def apply_mig_plan(nvml: Any, plan: Dict[str, Any], profiles: Dict[int, List[Dict[str, Any]]],
                   reset: Optional[Any] = None) -> Dict[str, Any]:
    """Carry out a MIG plan: destroy, set mode, reset, create. Does NVML I/O (and the reset callback's).

    Order per GPU, as mig-parted does it: destroy the MIG devices that must go, set the MIG mode;
    then reset the GPUs whose mode is pending (one call of ``reset`` with their indices); then on
    every GPU whose MIG mode is now enabled and whose devices differ, destroy and create the devices.

    :param nvml: the pynvml module (initialised).
    :param plan: the result of ``mig_plan.plan_mig`` (blocked GPUs are the caller's decision).
    :param profiles: ``{index: profiles}`` (:func:`read_mig_profiles`).
    :param reset: ``reset(indices) -> (rc, output)`` that resets GPUs (``nvidia-smi -r -i``), or
        ``None`` when no reset is allowed.
    :returns: ``{"actions": {index: [str]}, "errors": {index: message}, "error_names": {index: NVML
        name}, "reset": {gpus, rc, output} or None, "still_pending": [indices whose mode still
        waits for a reset or reboot], "gpus": [GPU records read at the end], "stopped": "NoPermission"
        or None}``. The run stops at the first NoPermission.
    """
    actions = dict((gpu_plan["index"], []) for gpu_plan in plan["gpus"])  # type: Dict[int, List[str]]
    errors = {}  # type: Dict[int, str]
    names = {}  # type: Dict[int, str]
    outcome = {"actions": actions, "errors": errors, "error_names": names, "reset": None, "still_pending": [],
               "gpus": [], "stopped": None}  # type: Dict[str, Any]

    def fail(index: int, name: str, message: str) -> bool:
        errors[index] = "%s: NVML %s" % (message, name)
        names[index] = name
        if name == "NoPermission":
            outcome["stopped"] = name
            outcome["gpus"] = read_gpus(nvml)["gpus"]
            return True
        return False

    work = [gpu_plan for gpu_plan in plan["gpus"] if gpu_plan["change"]]
    handles = {}  # type: Dict[int, Any]
    for gpu_plan in work:
        index = gpu_plan["index"]
        try:
            handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:  # pylint: disable=broad-except
            name = _nvml_error(nvml, err)
            if name is None:
                raise
            fail(index, name, "opening the GPU failed")
            continue
        before = gpu_plan["before"]
        if before["mode_current"] and before["mig_devices"] and (
                gpu_plan["layout_change"] or not gpu_plan["wanted"]["mig_enabled"]):
            actions[index].append("destroy_instances")
            done = destroy_mig_instances(nvml, handles[index])
            if done["error"]:
                if fail(index, done["error"], "destroying the MIG devices failed"):
                    return outcome
                continue
        if gpu_plan["set_mode"] is not None:
            actions[index].append("set_mode")
            answer = set_mig_mode(nvml, handles[index], gpu_plan["set_mode"])
            if answer["error"]:
                if fail(index, answer["error"], "setting MIG mode %s failed" % (
                        "enabled" if gpu_plan["set_mode"] else "disabled")):
                    return outcome
    current = dict((gpu["index"], gpu) for gpu in read_gpus(nvml)["gpus"])
    pending = [p["index"] for p in work
               if p["index"] not in errors and _mig_current(current[p["index"]]) != p["wanted"]["mig_enabled"]]
    if pending and reset is not None:
        rc, output = reset(pending)
        for index in pending:
            actions[index].append("reset")
        outcome["reset"] = {"gpus": pending, "rc": rc, "output": output}
        current = dict((gpu["index"], gpu) for gpu in read_gpus(nvml)["gpus"])
    outcome["still_pending"] = [index for index in pending if _mig_current(current[index]) != [
        p for p in work if p["index"] == index][0]["wanted"]["mig_enabled"]]
    for gpu_plan in work:
        index = gpu_plan["index"]
        wanted = gpu_plan["wanted"]
        if index in errors or not wanted["mig_enabled"] or not _mig_current(current[index]):
            continue
        now = current_layout(current[index])
        if now == wanted["mig_devices"]:
            continue
        if now:
            actions[index].append("destroy_instances")
            done = destroy_mig_instances(nvml, handles[index])
            if done["error"]:
                if fail(index, done["error"], "destroying the MIG devices failed"):
                    return outcome
                continue
        if wanted["mig_devices"]:
            actions[index].append("create_instances")
            made = create_mig_layout(nvml, handles[index], wanted["mig_devices"], profiles.get(index) or [])
            if made["error"]:
                if fail(index, made["error"], "creating %s failed after %d placement order(s)" % (
                        format_layout(wanted["mig_devices"]), made["tried"])):
                    return outcome
    outcome["gpus"] = read_gpus(nvml)["gpus"]
    return outcome
