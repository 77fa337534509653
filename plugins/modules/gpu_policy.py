#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_policy
short_description: Hold NVIDIA GPU power limit, persistence, ECC and compute mode to a policy
version_added: "0.1.0"
description:
  - Sets the power limit (watts, or percent of each GPU's default limit), persistence mode, ECC mode
    and compute mode of the GPUs of a node, or of the GPUs named by O(gpus), through NVML.
  - The whole request is validated against every selected GPU before any GPU is touched; a power
    limit outside a GPU's C([min, max]) range (C(nvmlDeviceGetPowerManagementLimitConstraints)) fails
    the task naming that GPU and its range.
  - Every change is read back. The power limit in effect is the enforced limit
    (C(nvmlDeviceGetEnforcedPowerLimit)); when the requested limit reads back as wanted but the
    enforced limit is lower (another limiter holds it), the setting is reported C(not_in_effect).
  - An ECC change is pending until the next reboot; the module reports it in RV(reboot_required) and
    never claims it is in effect before it is.
  - The power limit, persistence mode and compute mode return to their defaults at every reboot; the
    M(gpufleet.nvidia.gpu_policy) role installs a boot unit that applies them again.
  - Pending work found on a GPU whatever the policy (row remapping pending, MIG mode pending) is
    reported in RV(reset_required).
options:
  gpus:
    description:
      - The GPUs to apply the policy to; V(all) for every GPU of the node.
      - Each item is an NVML index (V(0)), a GPU UUID (V(GPU-...)) or a PCI bus id (V(0000:18:00.0)).
    type: list
    elements: str
    default: [all]
  power_limit_w:
    description:
      - The power limit in watts. Must lie within each selected GPU's range.
      - Mutually exclusive with O(power_limit_percent). Not managed when neither is given.
    type: float
  power_limit_percent:
    description:
      - The power limit as a percent of each GPU's default limit (C(nvmlDeviceGetPowerManagementDefaultLimit)),
        so one value fits GPUs with different defaults. The result must lie within each GPU's range.
    type: float
  persistence_mode:
    description:
      - Persistence mode on or off. Not managed when not given.
    type: bool
  ecc_mode:
    description:
      - ECC mode on or off. The change is pending until the next reboot. Not managed when not given.
    type: bool
  compute_mode:
    description:
      - The compute mode. Not managed when not given.
    type: str
    choices: [default, exclusive_process, prohibited]
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.nvidia.action_group
  - gpufleet.nvidia.gpu_setters
attributes:
  check_mode:
    support: full
    details: Reads the GPUs, validates the policy against them and reports what would change.
  diff_mode:
    support: full
    details: The managed settings of each selected GPU before and after (read back; ECC as its pending value).
  platform:
    platforms: posix
notes:
  - This module supports check mode.
seealso:
  - module: gpufleet.nvidia.gpu_mig
  - module: gpufleet.nvidia.gpu_facts
  - name: NVML API Reference Guide, Device Commands
    description: The NVML setters this module calls.
    link: https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceCommands.html
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Hold every H100 of the node at 600 W with persistence on and ECC on
  gpufleet.nvidia.gpu_policy:
    power_limit_w: 600
    persistence_mode: true
    ecc_mode: true
    compute_mode: default
  become: true

- name: Cap two GPUs at 85 percent of their default limit
  gpufleet.nvidia.gpu_policy:
    gpus: [0, 1]
    power_limit_percent: 85

- name: Show what would change, without changing anything
  gpufleet.nvidia.gpu_policy:
    power_limit_w: 350
    persistence_mode: true
  check_mode: true
  diff: true
  register: __policy_preview

- name: Fail when a setting is not supported instead of skipping it
  gpufleet.nvidia.gpu_policy:
    ecc_mode: true
    strict: true
"""

RETURN = r"""
changed:
  description: Whether a value read back after the setters differs from the value before.
  returned: always
  type: bool
gpus:
  description: One entry per selected GPU.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: NVML index of the GPU.
      type: int
      sample: 0
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-8a1e7f52-3c4d-4b6e-9f10-2a3b4c5d6e7f
    pci_bus_id:
      description: PCI bus id.
      type: str
      sample: "0000:18:00.0"
    name:
      description: Product name.
      type: str
      sample: NVIDIA H100 80GB HBM3
    wanted:
      description: The managed settings as the policy wants them (power limit resolved to watts).
      type: dict
      sample: {"power_limit_w": 600.0, "persistence_mode": true}
    in_effect:
      description:
        - The settings in effect, read back. C(power_limit_w) is the enforced limit; C(ecc_mode) the current mode.
      type: dict
      sample: {"power_limit_w": 600.0, "persistence_mode": true, "ecc_mode": true, "compute_mode": "default"}
    requested:
      description: The requested power limit (C(nvmlDeviceGetPowerManagementLimit)).
      type: dict
      sample: {"power_limit_w": 600.0}
    pending:
      description: Values that wait for a reboot (ECC mode).
      type: dict
      sample: {"ecc_mode": false}
    drift:
      description: Managed settings that are neither in effect nor pending as wanted.
      type: list
      elements: str
      sample: []
    changes:
      description: The planned changes, C({setting, before, after, effect}); C(effect) is C(immediate) or C(reboot_required).
      type: list
      elements: dict
    results:
      description:
        - One result per managed setting, C({setting, wanted, before, after, changed, status, message}).
        - C(status) is one of C(ok), C(applied), C(pending_reboot), C(not_in_effect), C(unsupported),
          C(no_permission), C(in_use), C(invalid_value), C(reset_required), C(gpu_lost), C(driver_error),
          C(failed), C(not_attempted), or C(would_change) in check mode.
      type: list
      elements: dict
    prior:
      description: The values before this run, to restore them later (there is no reset to a platform default for a power limit).
      type: dict
    reset_required:
      description: Reasons this GPU needs a GPU reset (row remapping pending, MIG mode pending).
      type: list
      elements: str
    reboot_required:
      description: Reasons this GPU needs a reboot (ECC mode pending).
      type: list
      elements: str
reset_required:
  description: Whether any selected GPU needs a GPU reset.
  returned: always
  type: bool
reboot_required:
  description: Whether any selected GPU needs a reboot for a setting to take effect.
  returned: always
  type: bool
unsupported:
  description: Settings skipped because a GPU does not support them, C({index, setting}).
  returned: always
  type: list
  elements: dict
  sample: [{"index": 0, "setting": "ecc_mode"}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_policy_plan import (
    PolicyError,
    describe_gpu,
    diff_view,
    plan_policy,
    policy_report,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import load_pynvml
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_policy_apply import (
    apply_policy_plan,
    assess_policy,
    planned_results,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_permission import (
    permission_message,
    read_permission_context,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_session import read_gpus, run_with_nvml

_SETTING_WORDS = {
    "power_limit_w": "the power limit",
    "persistence_mode": "persistence mode",
    "ecc_mode": "ECC mode",
    "compute_mode": "the compute mode",
}


def _gpu_entries(plan, assessment=None, check_mode=False):
    """Merge plan, results and read-back report into the per-GPU return entries."""
    assessed = {gpu["index"]: gpu for gpu in (assessment or {}).get("gpus", [])}
    entries = []
    for gpu_plan in plan["gpus"]:
        found = assessed.get(gpu_plan["index"])
        if found is not None and found["report"] is not None:
            report = found["report"]
            results = found["results"]
        else:
            report = policy_report(plan["policy"], gpu_plan["_record"])
            results = planned_results(gpu_plan, check_mode)
        entries.append({
            "index": gpu_plan["index"],
            "uuid": gpu_plan["uuid"],
            "pci_bus_id": gpu_plan["pci_bus_id"],
            "name": gpu_plan["name"],
            "wanted": report["wanted"],
            "in_effect": report["in_effect"],
            "requested": report["requested"],
            "pending": report["pending"],
            "drift": report["drift"],
            "changes": gpu_plan["changes"],
            "results": results,
            "prior": gpu_plan["prior"],
            "reset_required": report["reset_required"],
            "reboot_required": report["reboot_required"] or (
                list(gpu_plan["reboot_required"]) if check_mode else []),
        })
    return entries


def _fail_for_results(module, assessment, entries, plan, strict, diff):
    """Fail the task for results that did not reach the policy; warn for the tolerated ones."""
    problems = []
    for result in assessment["results"]:
        status = result["status"]
        gpu = [entry for entry in entries if entry["index"] == result["index"]][0]
        what = "%s of %s" % (_SETTING_WORDS.get(result["setting"], result["setting"]), describe_gpu(gpu))
        if status == "no_permission":
            context = read_permission_context()
            module.fail_json(msg=permission_message(what, context["euid"], context["container"],
                                                    context["cap_sys_admin"]),
                             changed=assessment["changed"], gpus=entries, diff=diff,
                             reset_required=assessment["reset_required"],
                             reboot_required=assessment["reboot_required"], unsupported=plan["unsupported"])
        if status in ("ok", "applied", "pending_reboot", "not_attempted"):
            continue
        if status in ("unsupported", "not_in_effect") and not strict:
            continue  # warned about when planning
        problems.append("%s: %s (%s)" % (describe_gpu(gpu), result["message"] or what, status))
    if problems:
        module.fail_json(msg="GPU policy not reached: %s" % "; ".join(problems), changed=assessment["changed"],
                         gpus=entries, diff=diff, reset_required=assessment["reset_required"],
                         reboot_required=assessment["reboot_required"], unsupported=plan["unsupported"])


def run(module, nvml):
    """Plan, apply, read back; returns the result dict."""
    params = module.params
    spec = {key: params[key] for key in ("gpus", "power_limit_w", "power_limit_percent", "persistence_mode",
                                         "ecc_mode", "compute_mode")}
    read = read_gpus(nvml)
    if read["error"]:
        module.fail_json(msg="NVML could not count the GPUs: %s" % read["error"])
    try:
        plan = plan_policy(spec, read["gpus"], strict=params["strict"])
    except PolicyError as err:
        module.fail_json(msg="GPU policy refused before any GPU was changed: %s" % "; ".join(err.errors),
                         errors=err.errors)
    by_index = {gpu["index"]: gpu for gpu in read["gpus"]}
    for gpu_plan in plan["gpus"]:
        gpu_plan["_record"] = by_index[gpu_plan["index"]]
    for item in plan["unsupported"]:
        module.warn("%s: %s is not supported; skipped" % (describe_gpu(by_index[item["index"]]), item["setting"]))
    for gpu_plan in plan["gpus"]:
        for entry in gpu_plan["not_in_effect"]:
            message = "%s: power limit %s W is requested but not in effect: %s" % (
                describe_gpu(gpu_plan), entry["wanted"], entry["reason"])
            if params["strict"]:
                module.fail_json(msg=message, gpus=_gpu_entries(plan), changed=False)
            module.warn(message)

    if module.check_mode or not plan["changes"]:
        before, after = diff_view(plan)
        entries = _gpu_entries(plan, check_mode=module.check_mode)
        result = {
            "changed": plan["changes"] > 0,
            "gpus": entries,
            "reset_required": plan["reset_required"],
            "reboot_required": any(entry["reboot_required"] for entry in entries),
            "unsupported": plan["unsupported"],
        }
        if module._diff:
            result["diff"] = {"before": before, "after": after}
        return result

    applied = apply_policy_plan(nvml, plan)
    after_read = read_gpus(nvml)
    assessment = assess_policy(plan, after_read["gpus"], applied["errors"])
    entries = _gpu_entries(plan, assessment)
    before, after = diff_view(plan, after_read["gpus"])
    diff = {"before": before, "after": after}
    _fail_for_results(module, assessment, entries, plan, params["strict"], diff)
    result = {
        "changed": assessment["changed"],
        "gpus": entries,
        "reset_required": assessment["reset_required"],
        "reboot_required": assessment["reboot_required"],
        "unsupported": plan["unsupported"],
    }
    if module._diff:
        result["diff"] = diff
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpus=dict(type="list", elements="str", default=["all"]),
            power_limit_w=dict(type="float"),
            power_limit_percent=dict(type="float"),
            persistence_mode=dict(type="bool"),
            ecc_mode=dict(type="bool"),
            compute_mode=dict(type="str", choices=["default", "exclusive_process", "prohibited"]),
            strict=dict(type="bool", default=False),
        ),
        mutually_exclusive=[("power_limit_w", "power_limit_percent")],
        supports_check_mode=True,
    )
    module.exit_json(**run_with_nvml(module, load_pynvml(), run))


if __name__ == "__main__":
    main()
