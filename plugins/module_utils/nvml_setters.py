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

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import error_name

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
    pending_after: Any = None,
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
    :param pending_after: for settings with current/pending values, the *current* value read back;
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
    if pending_requires is not None and pending_after is not None and not _same(pending_after, wanted):
        result["status"] = "pending_%s" % pending_requires
        result["message"] = "%s: %r is pending; in effect after a %s (current %r)" % (
            setting, wanted, "reboot" if pending_requires == "reboot" else "GPU reset", pending_after)
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
            return error_name(nvml, err)
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
_SMI_SUCCESS = re.compile(r"^(?:Power limit for GPU .* was set to|Enabled|Disabled|Set compute mode to|"
                          r"GPU .* was successfully reset|All done\.)", re.I)


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


def smi_reported_success(text: str) -> bool:
    """Tell whether an ``nvidia-smi`` setter run reported success for every GPU it touched.

    :param text: the run's stdout and stderr.
    :returns: ``False`` when :func:`classify_smi_output` finds any failure shape, even if the run
        ends in "All done." (field case 14); otherwise ``True`` when a success line is present.
        The caller still reads the value back: this only tells what the tool claimed.
    """
    if classify_smi_output(text):
        return False
    return any(_SMI_SUCCESS.search(line.strip()) for line in text.splitlines())


def summarize_status(results: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Group setter results by status.

    :param results: results of :func:`setter_result` (each may carry extra keys such as ``gpu``).
    :returns: ``{status: [results]}`` for the statuses present.
    """
    groups = {}  # type: Dict[str, List[Dict[str, Any]]]
    for result in results:
        groups.setdefault(result["status"], []).append(result)
    return groups


def first_fatal(results: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Return the first result whose status is in :data:`FATAL_OUTCOMES`, or ``None``."""
    for result in results:
        if result["status"] in FATAL_OUTCOMES:
            return result
    return None

