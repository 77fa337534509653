# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan a MIG layout declared in the format of NVIDIA's mig-parted, and diagnose a refused reset.

The layout format is mig-parted's ``version: v1`` configuration::

    version: v1
    mig-configs:
      all-1g.10gb:
        - devices: all                  # or a list of GPU indices, [0, 1]
          device-filter: "0x233010DE"   # optional: PCI device id + vendor id (string or list)
          mig-enabled: true
          mig-devices:
            "1g.10gb": 7

Each ``mig-devices`` entry is one GPU instance of that profile holding one compute instance of
the same size, as mig-parted creates them. A GPU matched by no entry is left alone.

Pure functions: they take the parsed YAML, facts-model GPU records and each GPU's MIG profiles
(as ``mig_devices.read_mig_profiles`` reads them through ``nvmlDeviceGetGpuInstanceProfileInfo``)
and return plans and messages. Sources: mig-parted README and ``pkg/types`` (config format),
NVIDIA MIG User Guide (profiles, slices, "MIG mode ... GPU reset"), mig-parted issue 181 and
field case 13 (a reset refused "In use by another client" while ``nvidia_drm`` is loaded).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_policy_plan import describe_gpu

_ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
_PROFILE_NAME = re.compile(r"^\d+g\.\d+gb(?:\+[a-z0-9.]+)?$")
_DEVICE_ID = re.compile(r"^(?:0x)?([0-9a-fA-F]{8})$")

# Memory of a GPU splits into 8 slices and compute into 7 on every MIG-capable GPU so far
# (A100, A30 has 4, H100, H200, B200): the totals are taken from the largest profile found.
_DEFAULT_MEMORY_SLICES = 8


class MigConfigError(ValueError):
    """A MIG configuration that cannot be applied as written; ``errors`` lists every reason."""

    def __init__(self, errors: List[str]) -> None:
        self.errors = list(errors)
        super(MigConfigError, self).__init__("; ".join(self.errors))


def normalize_device_filter(value: Any) -> List[str]:
    """Normalise a mig-parted ``device-filter``: ``"0x233010DE"`` → ``["0x233010de"]``.

    :param value: ``None``, a string, or a list of strings; each is the 32-bit PCI id as
        mig-parted writes it (device id in the high 16 bits, vendor ``10DE`` in the low ones), the
        form of NVML's ``nvmlPciInfo_t.pciDeviceId``.
    :returns: the ids in lower case with ``0x``; ``[]`` for ``None``.
    :raises MigConfigError: for a value that is not such an id.
    """
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    result = []
    errors = []
    for item in items:
        match = _DEVICE_ID.match(str(item).strip())
        if not match:
            errors.append("device-filter %r is not a PCI device id such as 0x233010DE" % (item,))
        else:
            result.append("0x" + match.group(1).lower())
    if errors:
        raise MigConfigError(errors)
    return result


def _normalize_entry(entry: Any, where: str, errors: List[str]) -> Optional[Dict[str, Any]]:
    if not isinstance(entry, dict):
        errors.append("%s: an entry must be a mapping with devices, mig-enabled, mig-devices" % where)
        return None
    unknown = sorted(set(entry) - set(_ENTRY_KEYS))
    if unknown:
        errors.append("%s: unknown keys %s (known: %s)" % (where, ", ".join(unknown), ", ".join(_ENTRY_KEYS)))
    devices = entry.get("devices", "all")
    if devices == "all":
        pass
    elif isinstance(devices, list) and devices and all(
            (isinstance(item, int) and not isinstance(item, bool)) or str(item).isdigit() for item in devices):
        devices = sorted(set(int(item) for item in devices))
    else:
        errors.append("%s: devices must be 'all' or a list of GPU indices, got %r" % (where, devices))
        devices = []
    try:
        device_filter = normalize_device_filter(entry.get("device-filter"))
    except MigConfigError as err:
        errors.extend("%s: %s" % (where, message) for message in err.errors)
        device_filter = []
    enabled = entry.get("mig-enabled")
    if not isinstance(enabled, bool):
        errors.append("%s: mig-enabled must be true or false, got %r" % (where, enabled))
        enabled = False
    mig_devices = entry.get("mig-devices") or {}
    if not isinstance(mig_devices, dict):
        errors.append("%s: mig-devices must map profile names to counts, got %r" % (where, mig_devices))
        mig_devices = {}
    layout = {}
    for name, count in mig_devices.items():
        if not _PROFILE_NAME.match(str(name)):
            errors.append("%s: %r is not a MIG profile name such as 1g.10gb or 1g.10gb+me" % (where, name))
            continue
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            errors.append("%s: the count of %s must be a whole number >= 0, got %r" % (where, name, count))
            continue
        if count:
            layout[str(name)] = count
    if layout and not enabled:
        errors.append("%s: mig-devices given with mig-enabled: false" % where)
    return {"devices": devices, "device_filter": device_filter, "mig_enabled": enabled, "mig_devices": layout}


def parse_mig_config(config: Any, label: Optional[str] = None) -> List[Dict[str, Any]]:
    """Check a mig-parted configuration and return the entries of one label.

    :param config: either the whole document ``{"version": "v1", "mig-configs": {label: [entries]}}``
        (then ``label`` names the configuration to use) or the list of entries of one label.
    :param label: the configuration name in ``mig-configs``.
    :returns: the entries normalised: ``{"devices": "all"|[int], "device_filter": ["0x233010de"],
        "mig_enabled": bool, "mig_devices": {profile: count}}`` (zero counts dropped).
    :raises MigConfigError: wrong version, unknown label (naming the labels present), malformed
        entries; every problem found is listed.
    """
    errors = []  # type: List[str]
    where = "mig config"
    if isinstance(config, dict):
        version = config.get("version")
        if version != "v1":
            errors.append("mig config version must be v1, got %r" % (version,))
        configs = config.get("mig-configs")
        if not isinstance(configs, dict) or not configs:
            raise MigConfigError(errors + ["mig config has no mig-configs mapping"])
        if label is None:
            raise MigConfigError(errors + ["choose a configuration label among: %s" % ", ".join(sorted(configs))])
        if label not in configs:
            raise MigConfigError(errors + ["mig config has no label %r (labels: %s)" % (label, ", ".join(sorted(configs)))])
        entries = configs[label]
        where = "mig-configs.%s" % label
    else:
        entries = config
    if not isinstance(entries, list) or not entries:
        raise MigConfigError(errors + ["%s must be a non-empty list of entries" % where])
    normalized = []
    for number, entry in enumerate(entries):
        item = _normalize_entry(entry, "%s[%d]" % (where, number), errors)
        if item is not None:
            normalized.append(item)
    if errors:
        raise MigConfigError(errors)
    return normalized


def resolve_layout(entries: List[Dict[str, Any]], gpus: List[Dict[str, Any]]) -> Dict[int, Dict[str, Any]]:
    """Which entry applies to which GPU.

    :param entries: the result of :func:`parse_mig_config`.
    :param gpus: facts-model GPU records (``index``, ``pci_device_id`` as ``"0x233010de"``).
    :returns: ``{index: {"mig_enabled": bool, "mig_devices": {profile: count}, "entry": n}}`` for
        the GPUs an entry matches.
    :raises MigConfigError: an index in ``devices`` that is not on the node, or a GPU matched by two
        entries (mig-parted's result would depend on the order).
    """
    errors = []
    chosen = {}  # type: Dict[int, Dict[str, Any]]
    indices = [gpu.get("index") for gpu in gpus]
    for number, entry in enumerate(entries):
        if entry["devices"] != "all":
            missing = [index for index in entry["devices"] if index not in indices]
            if missing:
                errors.append("entry %d names GPU %s, not on this node (GPU indices present: %s)" % (
                    number, ", ".join(str(index) for index in missing), ", ".join(str(i) for i in indices) or "none"))
        for gpu in gpus:
            if entry["devices"] != "all" and gpu.get("index") not in entry["devices"]:
                continue
            if entry["device_filter"] and (gpu.get("pci_device_id") or "").lower() not in entry["device_filter"]:
                continue
            if gpu["index"] in chosen:
                errors.append("%s is matched by entries %d and %d" % (
                    describe_gpu(gpu), chosen[gpu["index"]]["entry"], number))
                continue
            chosen[gpu["index"]] = {"mig_enabled": entry["mig_enabled"], "mig_devices": dict(entry["mig_devices"]),
                                    "entry": number}
    if errors:
        raise MigConfigError(errors)
    return chosen


def profile_memory_slices(profile: Dict[str, Any], profiles: List[Dict[str, Any]]) -> int:
    """The memory slices (eighths of the GPU's memory) a GPU-instance profile takes.

    :param profile: ``{name, memory_mib, ...}`` of one profile.
    :param profiles: every profile of the GPU; the largest memory is the whole GPU (8 slices).
    :returns: ``round(8 × memory / largest memory)``, at least 1 (``1g.10gb`` → 1, ``1g.20gb`` → 2,
        ``3g.40gb`` → 4, ``7g.80gb`` → 8 on an H100 80GB).
    """
    largest = max((item.get("memory_mib") or 0) for item in profiles) or 0
    memory = profile.get("memory_mib") or 0
    if not largest or not memory:
        return 1
    return max(1, int(round(_DEFAULT_MEMORY_SLICES * float(memory) / float(largest))))


def layout_errors(layout: Dict[str, int], profiles: List[Dict[str, Any]]) -> List[str]:
    """Check a layout against one GPU's MIG profiles.

    Checks: each profile exists on this GPU; each count ≤ that profile's ``instance_count``
    (``nvmlGpuInstanceProfileInfo_t.instanceCount``); the compute slices (``sliceCount``) add up to
    at most the GPU's (the largest profile's, 7); the memory slices add up to at most 8. Placement
    rules beyond these are checked by the GPU when the instances are created.

    :param layout: ``{profile name: count}``.
    :param profiles: ``[{name, id, slice_count, instance_count, memory_mib}]`` of the GPU.
    :returns: messages without the GPU's name (the caller adds it); empty when the layout fits.
    """
    if not layout:
        return []
    by_name = {profile["name"]: profile for profile in profiles}
    errors = []
    compute = 0
    memory = 0
    for name, count in sorted(layout.items()):
        profile = by_name.get(name)
        if profile is None:
            errors.append("MIG profile %s does not exist on this GPU (profiles: %s)" % (
                name, ", ".join(sorted(by_name)) or "none"))
            continue
        if profile.get("instance_count") is not None and count > profile["instance_count"]:
            errors.append("%d × %s asked, at most %d fit on this GPU" % (count, name, profile["instance_count"]))
        compute += count * (profile.get("slice_count") or 1)
        memory += count * profile_memory_slices(profile, profiles)
    if not errors:
        total = max((profile.get("slice_count") or 0) for profile in profiles) or 7
        if compute > total:
            errors.append("layout %s needs %d compute slices, the GPU has %d" % (format_layout(layout), compute, total))
        if memory > _DEFAULT_MEMORY_SLICES:
            errors.append("layout %s needs %d memory slices, the GPU has %d" % (
                format_layout(layout), memory, _DEFAULT_MEMORY_SLICES))
    return errors


def format_layout(layout: Dict[str, int]) -> str:
    """``{"1g.10gb": 2, "3g.40gb": 1}`` → ``"1g.10gb×2 + 3g.40gb×1"``; ``{}`` → ``"none"``."""
    if not layout:
        return "none"
    return " + ".join("%s×%d" % (name, layout[name]) for name in sorted(layout))


def current_layout(gpu: Dict[str, Any]) -> Dict[str, int]:
    """The MIG layout a GPU has now: profile → number of GPU instances.

    :param gpu: a facts-model GPU record; ``mig.devices`` lists MIG devices (one per compute
        instance) with ``gpu_instance_id`` and ``profile``.
    :returns: ``{profile: count}`` counting each GPU instance once; a device whose profile is
        unknown counts under ``"unknown"`` so that it never matches a wanted layout.
    """
    seen = {}  # type: Dict[Any, str]
    for number, device in enumerate((gpu.get("mig") or {}).get("devices") or []):
        key = device.get("gpu_instance_id")
        if key is None:
            key = ("device", number)
        if key not in seen:
            seen[key] = device.get("profile") or "unknown"
    layout = {}  # type: Dict[str, int]
    for name in seen.values():
        layout[name] = layout.get(name, 0) + 1
    return layout


def describe_processes(processes: Optional[List[Dict[str, Any]]]) -> str:
    """``[{pid: 4242, name: "python3"}]`` → ``"pid 4242 (python3)"``, joined with ", "."""
    parts = []
    for proc in processes or []:
        name = proc.get("name")
        parts.append("pid %s (%s)" % (proc.get("pid"), name) if name else "pid %s" % proc.get("pid"))
    return ", ".join(parts)


def plan_mig(entries: List[Dict[str, Any]], gpus: List[Dict[str, Any]],
             profiles: Dict[int, List[Dict[str, Any]]], strict: bool = False) -> Dict[str, Any]:
    """Plan a MIG layout on a node.

    :param entries: the result of :func:`parse_mig_config`.
    :param gpus: the node's facts-model GPU records (``mig.mode_current``/``mode_pending``,
        ``mig.devices``, ``processes``, ``pci_device_id``).
    :param profiles: ``{index: [profile]}`` as ``mig_devices.read_mig_profiles`` reads them;
        ``[]`` or absent for a GPU without MIG.
    :param strict: refuse instead of skip when an entry asks MIG on a GPU that has no MIG.
    :returns: ``{"gpus": [per-GPU plan], "changes": int, "blocked": [per-GPU plan],
        "skipped": [{index, reason}], "reset_required": bool}``. A per-GPU plan is ``{index, uuid,
        pci_bus_id, name, wanted: {mig_enabled, mig_devices}, before: {mode_current, mode_pending,
        mig_devices}, set_mode: bool|None (the mode to set, None for no change), needs_reset: bool
        (the mode change waits for a GPU reset), layout_change: bool, processes: [...],
        blocked: bool}``. ``blocked`` is true when a change is needed and compute processes run on
        the GPU (the module refuses unless forced).
    :raises MigConfigError: GPUs the entries name that do not exist, overlapping entries, a GPU that
        cannot be read, layouts that do not fit a GPU's profiles (each GPU named), and under
        ``strict`` MIG asked on a GPU without MIG.
    """
    by_index = {gpu.get("index"): gpu for gpu in gpus}
    wanted_by_index = resolve_layout(entries, gpus)
    errors = []
    plans = []
    skipped = []
    for index in sorted(wanted_by_index):
        gpu = by_index[index]
        wanted = wanted_by_index[index]
        name = describe_gpu(gpu)
        if gpu.get("readable") is False:
            errors.append("%s cannot be read (%s)" % (name, ", ".join(gpu.get("errors") or []) or "unknown error"))
            continue
        mig = gpu.get("mig") or {}
        current, pending = mig.get("mode_current"), mig.get("mode_pending")
        if current is None:
            if wanted["mig_enabled"]:
                reason = "%s has no MIG (NVML gives no MIG mode)" % name
                if strict:
                    errors.append(reason + " (strict)")
                else:
                    skipped.append({"index": index, "reason": reason})
            continue
        if wanted["mig_enabled"] and not profiles.get(index):
            errors.append("%s reports no MIG profiles: cannot lay out %s" % (name, format_layout(wanted["mig_devices"])))
            continue
        problems = layout_errors(wanted["mig_devices"], profiles.get(index) or []) if wanted["mig_enabled"] else []
        errors.extend("%s: %s" % (name, problem) for problem in problems)
        if problems:
            continue
        if pending is None:
            pending = current
        now = current_layout(gpu)
        set_mode = None
        if bool(pending) != wanted["mig_enabled"]:
            set_mode = wanted["mig_enabled"]
        needs_reset = bool(current) != wanted["mig_enabled"]
        layout_change = wanted["mig_enabled"] and now != wanted["mig_devices"]
        if not wanted["mig_enabled"] and current and now:
            # disabling: instances are destroyed first, as NVML refuses to leave MIG mode with instances
            layout_change = True
        processes = gpu.get("processes") or []
        change = set_mode is not None or needs_reset or layout_change
        plans.append({
            "index": index,
            "uuid": gpu.get("uuid"),
            "pci_bus_id": gpu.get("pci_bus_id"),
            "name": gpu.get("name"),
            "wanted": {"mig_enabled": wanted["mig_enabled"], "mig_devices": dict(wanted["mig_devices"])},
            "before": {"mode_current": bool(current), "mode_pending": bool(pending), "mig_devices": now},
            "set_mode": set_mode,
            "needs_reset": needs_reset,
            "layout_change": bool(layout_change),
            "processes": processes,
            "blocked": bool(change and processes),
            "change": bool(change),
        })
    if errors:
        raise MigConfigError(errors)
    return {
        "gpus": plans,
        "changes": sum(1 for plan in plans if plan["change"]),
        "blocked": [plan for plan in plans if plan["blocked"]],
        "skipped": skipped,
        "reset_required": any(plan["needs_reset"] for plan in plans),
    }


def blocked_message(plan: Dict[str, Any]) -> str:
    """Explain a refusal to touch GPUs with compute processes, naming each process.

    :param plan: the result of :func:`plan_mig`.
    :returns: e.g. ``"MIG change refused: GPU 0 (0000:18:00.0, NVIDIA H100 80GB HBM3) runs
        pid 4242 (python3). Stop these processes (drain the node) or set force: true."``
    """
    parts = ["%s runs %s" % (describe_gpu(gpu), describe_processes(gpu["processes"])) for gpu in plan["blocked"]]
    return ("MIG change refused: %s. Stop these processes (drain the node) or set force: true."
            % "; ".join(parts))


def assert_messages(plan: Dict[str, Any]) -> List[str]:
    """What differs from the wanted layout, one message per GPU (the ``assert`` mode of mig-parted).

    :param plan: the result of :func:`plan_mig`.
    :returns: e.g. ``"GPU 1 (...): MIG mode disabled, wanted enabled"``,
        ``"GPU 1 (...): MIG devices 1g.10gb×3, wanted 1g.10gb×7"``; empty when all match.
    """
    messages = []
    for gpu in plan["gpus"]:
        name = describe_gpu(gpu)
        before, wanted = gpu["before"], gpu["wanted"]
        if before["mode_current"] != wanted["mig_enabled"] or before["mode_pending"] != wanted["mig_enabled"]:
            state = "enabled" if before["mode_current"] else "disabled"
            if before["mode_pending"] != before["mode_current"]:
                state += " (pending %s)" % ("enabled" if before["mode_pending"] else "disabled")
            messages.append("%s: MIG mode %s, wanted %s" % (
                name, state, "enabled" if wanted["mig_enabled"] else "disabled"))
        elif wanted["mig_enabled"] and before["mig_devices"] != wanted["mig_devices"]:
            messages.append("%s: MIG devices %s, wanted %s" % (
                name, format_layout(before["mig_devices"]), format_layout(wanted["mig_devices"])))
    return messages


def diagnose_reset_failure(
    gpus: List[Dict[str, Any]],
    smi_entries: Optional[List[Dict[str, Any]]] = None,
    nvidia_drm_loaded: bool = False,
    persistenced_pids: Optional[List[int]] = None,
    holders: Optional[List[Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """Say why a GPU reset (needed to activate a MIG mode change) was refused, and what to do.

    A reset refused "In use by another client" with no compute process on the GPUs is held by a
    kernel client or a daemon, not by a job: field case 13 (mig-parted issue 181) is ``nvidia_drm``;
    ``nvidia-persistenced`` keeps the device files open too. "Kill all processes" is the wrong advice
    there.

    :param gpus: facts-model records of the GPUs whose reset failed (``processes`` as read).
    :param smi_entries: what :func:`smi_messages.classify_smi_output` found in the reset's output.
    :param nvidia_drm_loaded: ``/sys/module/nvidia_drm`` exists (``lsmod`` lists ``nvidia_drm``).
    :param persistenced_pids: pids of running ``nvidia-persistenced``.
    :param holders: other processes that hold ``/dev/nvidia*`` open: ``[{pid, name}]``.
    :returns: ``{"causes": [..], "message": str, "remedy": [steps], "gpus": [bus ids],
        "reboot_required": True}``; causes among ``compute_processes``, ``nvidia_drm``,
        ``nvidia_persistenced``, ``device_holders``, ``no_permission``, ``unsupported``, ``unknown``.
    """
    entries = smi_entries or []
    statuses = set(entry["status"] for entry in entries)
    bus_ids = [entry["pci_bus_id"] for entry in entries if entry.get("pci_bus_id")]
    if not bus_ids:
        bus_ids = [gpu.get("pci_bus_id") for gpu in gpus if gpu.get("pci_bus_id")]
    causes = []
    remedy = []
    details = []
    running = [(gpu, gpu.get("processes")) for gpu in gpus if gpu.get("processes")]
    if "no_permission" in statuses:
        causes.append("no_permission")
        details.append("the reset was refused for lack of permission")
        remedy.append("run as root on the host (a container needs CAP_SYS_ADMIN)")
    if "unsupported" in statuses:
        causes.append("unsupported")
        details.append("this GPU or platform does not support a GPU reset (e.g. a GPU in an NVLink/NVSwitch "
                       "system that must be reset together, or a passthrough VM)")
        remedy.append("reboot the node")
    if running:
        causes.append("compute_processes")
        details.append("compute processes run: %s" % "; ".join(
            "%s: %s" % (describe_gpu(gpu), describe_processes(procs)) for gpu, procs in running))
        remedy.append("stop those processes (drain the node), then apply again")
    if nvidia_drm_loaded:
        causes.append("nvidia_drm")
        details.append("no compute process holds the GPUs%s, but the nvidia_drm kernel module is loaded and "
                       "holds them" % ("" if not running else " besides those"))
        remedy.append("stop its users (display manager, e.g. systemctl isolate multi-user.target), unload it "
                      "(modprobe -r nvidia_drm), apply again, then load it back (modprobe nvidia_drm)")
    if persistenced_pids:
        causes.append("nvidia_persistenced")
        details.append("nvidia-persistenced (pid %s) keeps the GPUs open" % ", ".join(str(pid) for pid in persistenced_pids))
        remedy.append("stop nvidia-persistenced (systemctl stop nvidia-persistenced), apply again, start it again")
    if holders:
        causes.append("device_holders")
        details.append("other processes hold /dev/nvidia*: %s" % describe_processes(holders))
        remedy.append("stop those processes (monitoring agents such as dcgm or nvidia-smi loops, "
                      "nvidia-fabricmanager), then apply again")
    if not causes:
        causes.append("unknown")
        details.append("the reset was refused and no holder was found")
    remedy.append("or reboot the node: the pending MIG mode takes effect at boot")
    reason = "; ".join(entry["message"] for entry in entries[:4]) if entries else "GPU reset failed"
    message = "GPU reset refused for %s (%s): %s. To do: %s." % (
        ", ".join(bus_ids) or "the GPUs", reason, "; ".join(details), "; ".join(remedy))
    return {"causes": causes, "message": message, "remedy": remedy, "gpus": bus_ids, "reboot_required": True}
