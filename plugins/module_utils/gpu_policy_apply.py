# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Apply a GPU policy plan through NVML and judge the result from the read-back.

:func:`apply_policy_plan` calls one NVML setter per planned change (``gpu_policy_plan.plan_policy``)
and stops at the first error that every further call would repeat; :func:`assess_policy` builds
each setting's result (``setter_outcome.setter_result``) from the plan, the setters' errors and
the values read back, so ``changed`` comes from the read-back only (field cases 14, 15).
:func:`planned_results` gives the results of a run that applied nothing (check mode).

Setters: NVML API Reference, "Device Commands". Only :func:`apply_change` and
:func:`apply_policy_plan` do NVML I/O; the rest are pure.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_policy_plan import (
    COMPUTE_MODES,
    diff_value,
    observed,
    policy_report,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_session import call_setter, nvml_error_name
from ansible_collections.gpufleet.nvidia.plugins.module_utils.setter_outcome import FATAL_OUTCOMES, outcome_of_error, setter_result


def assess_policy(plan: Dict[str, Any], after_gpus: List[Dict[str, Any]],
                  errors: Dict[str, Optional[str]]) -> Dict[str, Any]:
    """Judge what a run did, from the plan, the setters' errors and the values read back.

    ``changed`` comes from the read-back only (``setter_outcome.setter_result``): a setter that
    reported success while the value did not move is ``failed``, never ``changed``.

    :param plan: the result of ``gpu_policy_plan.plan_policy``.
    :param after_gpus: the node's GPU records read after the setters ran.
    :param errors: ``{"<index>/<setting>": NVML error name or None}`` as
        :func:`apply_policy_plan` returns it; a planned change with no key was not
        attempted (the run stopped before it).
    :returns: ``{"gpus": [{index, uuid, pci_bus_id, name, results: [setter result + index],
        changed, report}], "changed": bool, "results": [all results], "reset_required": bool,
        "reboot_required": bool}``; ``report`` is ``gpu_policy_plan.policy_report`` of the read-back.
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
    :returns: a result shaped like ``setter_outcome.setter_result``, ``changed`` false, ``status``
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
            name = nvml_error_name(nvml, err)
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
