# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Apply the node's GPU policy again at boot: power limit, persistence, compute mode, MIG layout.

These settings do not survive a reboot (NVML API Reference, "Device Commands": the power limit,
persistence mode and compute mode return to their defaults; MIG devices are gone). ECC mode
survives reboots and is left to the gpu_policy module.

Run by the gpufleet-gpu-policy.service oneshot unit. Reads the policy the gpu_policy role wrote
(JSON), waits for NVML to come up, plans with the same code the Ansible modules use (a copy of the
collection's module_utils installed next to this script), applies through NVML, reads back, and
writes a per-GPU report (wanted / in effect / pending) as JSON. Exit status: 0 when everything is
in effect (or pending a reboot), 1 when something is not, 2 when the policy could not be applied
at all (no NVML, invalid policy).

Usage: gpu_policy_boot.py [--policy FILE] [--report FILE] [--lib DIR]
"""

import argparse
import json
import os
import sys
import time

DEFAULT_POLICY = "/etc/gpufleet/gpu_policy.json"
DEFAULT_REPORT = "/var/lib/gpufleet/gpu_policy/boot-report.json"
DEFAULT_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python")


def _log(message):
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def _write_json(path, data):
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.rename(tmp, path)


def _init(nvml, wait_s, error_name):
    """nvmlInit, retried while the driver is still coming up; returns None or the last error name."""
    deadline = time.time() + max(0, wait_s)
    while True:
        try:
            nvml.nvmlInit()
            return None
        except Exception as err:  # pylint: disable=broad-except
            name = "LibraryNotFound" if isinstance(err, OSError) else error_name(nvml, err)
            if name not in ("DriverNotLoaded", "LibraryNotFound", "Uninitialized", "Unknown") or time.time() >= deadline:
                return name
            time.sleep(2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--report", default=DEFAULT_REPORT)
    parser.add_argument("--lib", default=DEFAULT_LIB)
    args = parser.parse_args(argv)

    sys.path.insert(0, args.lib)
    from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_policy_plan import (
        PolicyError, BOOT_REAPPLIED, describe_gpu, plan_policy)
    from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_plan import (
        MigConfigError, current_layout, parse_mig_config, plan_mig)
    from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import error_name, load_pynvml
    from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_policy_apply import (
        apply_policy_plan,
        assess_policy,
    )
    from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_apply import apply_mig_plan
    from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_devices import read_mig_profiles
    from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_session import init_error_message, read_gpus

    with open(args.policy) as handle:
        config = json.load(handle)
    report = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "boot_id": None, "ok": False,
              "gpus": [], "mig": [], "errors": []}
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            report["boot_id"] = handle.read().strip()
    except (IOError, OSError):
        pass

    nvml = load_pynvml()
    if nvml is None:
        report["errors"].append("pynvml (nvidia-ml-py) is not installed for %s" % sys.executable)
        _write_json(args.report, report)
        _log(report["errors"][0])
        return 2
    failure = _init(nvml, int(config.get("wait_s", 120)), error_name)
    if failure:
        report["errors"].append(init_error_message(failure))
        _write_json(args.report, report)
        _log(report["errors"][0])
        return 2
    status = 0
    try:
        spec = dict((key, value) for key, value in (config.get("policy") or {}).items()
                    if key == "gpus" or key in BOOT_REAPPLIED or key == "power_limit_percent")
        gpus = read_gpus(nvml)["gpus"]
        if any(value is not None for key, value in spec.items() if key != "gpus"):
            try:
                plan = plan_policy(spec, gpus, strict=bool(config.get("strict")))
            except PolicyError as err:
                report["errors"].extend(err.errors)
                _log("policy refused: %s" % "; ".join(err.errors))
                status = 2
            else:
                applied = apply_policy_plan(nvml, plan)
                after = read_gpus(nvml)["gpus"]
                assessment = assess_policy(plan, after, applied["errors"])
                for gpu in assessment["gpus"]:
                    entry = dict(gpu["report"] or {})
                    entry["results"] = gpu["results"]
                    report["gpus"].append(entry)
                    for result in gpu["results"]:
                        if result["status"] not in ("ok", "applied", "pending_reboot", "unsupported"):
                            status = 1
                        if result["status"] != "ok":
                            _log("%s: %s %s (%s)" % (describe_gpu(gpu), result["setting"], result["status"],
                                                     result["message"]))
                gpus = after
        mig = config.get("mig")
        if mig:
            try:
                entries = parse_mig_config(mig.get("config") if mig.get("config") is not None else mig.get("layout"),
                                           mig.get("label"))
                profiles = {}
                for gpu in gpus:
                    if (gpu.get("mig") or {}).get("mode_current") is not None:
                        profiles[gpu["index"]] = read_mig_profiles(nvml, nvml.nvmlDeviceGetHandleByIndex(gpu["index"]))
                mig_plan = plan_mig(entries, gpus, profiles, strict=bool(config.get("strict")))
            except MigConfigError as err:
                report["errors"].extend(err.errors)
                _log("MIG layout refused: %s" % "; ".join(err.errors))
                status = 2
            else:
                blocked = [gpu["index"] for gpu in mig_plan["blocked"]]
                runnable = dict(mig_plan, gpus=[gpu for gpu in mig_plan["gpus"] if gpu["index"] not in blocked])
                outcome = apply_mig_plan(nvml, runnable, profiles, None)
                final = dict((gpu["index"], gpu) for gpu in outcome["gpus"] or read_gpus(nvml)["gpus"])
                for gpu_plan in mig_plan["gpus"]:
                    gpu = final.get(gpu_plan["index"], {})
                    layout = current_layout(gpu)
                    mode = (gpu.get("mig") or {}).get("mode_current")
                    wanted = gpu_plan["wanted"]
                    in_effect = bool(mode) == wanted["mig_enabled"] and (
                        not wanted["mig_enabled"] or layout == wanted["mig_devices"])
                    entry = {"index": gpu_plan["index"], "pci_bus_id": gpu_plan["pci_bus_id"], "wanted": wanted,
                             "in_effect": {"mig_enabled": bool(mode), "mig_devices": layout},
                             "pending": {"mig_enabled": bool((gpu.get("mig") or {}).get("mode_pending"))},
                             "actions": outcome["actions"].get(gpu_plan["index"], []),
                             "error": outcome["errors"].get(gpu_plan["index"]),
                             "blocked_by": gpu_plan["processes"] if gpu_plan["index"] in blocked else []}
                    report["mig"].append(entry)
                    if not in_effect:
                        status = max(status, 1)
                        _log("%s: MIG layout not in effect: %s" % (describe_gpu(gpu_plan), entry))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # pylint: disable=broad-except
            pass
    report["ok"] = status == 0
    _write_json(args.report, report)
    _log("GPU policy at boot: %s (%d GPU(s), %d MIG GPU(s))" % (
        "in effect" if status == 0 else "NOT in effect", len(report["gpus"]), len(report["mig"])))
    return status


if __name__ == "__main__":
    sys.exit(main())
