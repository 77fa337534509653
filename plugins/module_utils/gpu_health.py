# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is a GPU usable, is a node usable: one verdict whatever form the signal takes.

A GPU that needs a reset, or that its driver reports unusable, is not healthy, whether the
driver said so with a numbered Xid (e.g. Xid 154 "GPU Reset Required", Xid 79, Xid 119), a
message without a number ("GPU marked for reset", ``NV_ERR_RESET_REQUIRED``, "fallen off the
bus"), an NVML field (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, remapped rows pending or failed,
retired pages pending, GpuIsLost) or an nvidia-smi value ("[GPU requires reset]"). The node has
its own problems, with their own remedies: a driver module the kernel refused to load (a
signature rejected under Secure Boot: a reboot will not fix it) and a companion module that did
not load (``nvidia_peermem``: GPUDirect RDMA is gone while every GPU looks fine).

Healthy means every signal was read and none was bad, not "nothing matched". Three more
verdicts than usable / not usable keep that promise:

- ``unknown``: a line of the NVIDIA modules at error level that no reader understood
  (``kernel_log_unrecognised``, kernel_log_coverage): nothing can be said of what it means, so the
  node is not healthy, and no gate takes it as verified;
- ``degraded``: a GPU whose clocks are held down by hardware (HW slowdown, HW power brake,
  thermal slowdown: NVML clocks event reasons) works, slower; not healthy at a gate, not a reset;
- a fatal NVSwitch SXid (``sxid_events``, nvswitch_log) is a problem of the node's NVLink fabric,
  and a GPU whose fabric registration is not ``completed``/``success`` (``gpus[].fabric``,
  ``nvmlDeviceGetGpuFabricInfo``, ``nvidia-smi -q`` "Fabric") cannot run CUDA (field case 43);
  a GPU the driver could not initialise (``driver_messages`` of kind ``gpu_init_failed``) is not
  usable (field case 38).

Pure functions over the ``ansible_facts.nvidia`` document (docs/facts.md, docs/contract.md).
Sources: NVIDIA Xid catalog (xid_catalog), NVML API reference ("Field Value Enums",
``nvmlDeviceGetRemappedRows``, ``nvmlDeviceGetRetiredPagesPendingStatus``), field cases 04, 09,
30, 32 and 33.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.xid_catalog import action_rank

#: Actions that take a GPU out of service until they are done (xid_catalog.ACTIONS).
UNUSABLE_ACTIONS = ("reset_gpu", "reboot", "hardware_inspection")

# extended.recovery_action (facts_model.GPU_RECOVERY_ACTIONS) → xid_catalog action.
_RECOVERY_TO_ACTION = {
    "gpu_reset": "reset_gpu",
    "drain_and_reset": "reset_gpu",
    "drain_p2p": "reset_gpu",
    "bus_reset": "reset_gpu",
    "node_reboot": "reboot",
    "system_reboot": "reboot",
    "recover_imex_domain": "reset_gpu",
}

#: Node problems: kind → (what it means, the remedy, whether a reboot alone fixes it).
NODE_PROBLEMS = {
    "module_signature_rejected": (
        "the kernel refused the NVIDIA kernel module's signature (Secure Boot / lockdown): the driver is not loaded",
        "enroll the key that signed the module as a Machine Owner Key (mokutil --import, then confirm at the next "
        "boot; on kernels that keep MOKs out of the machine keyring also trust it for modules with "
        "mokutil --trust-mok-list), or install the distribution's or NVIDIA's signed precompiled modules, or boot "
        "a kernel that trusts the key; a reboot into the same kernel will not load it",
        False),
    "companion_module_not_loaded": (
        "a module of the NVIDIA driver set did not load",
        "rebuild or reinstall the module against the running kernel's modules, then load in order",
        False),
    "peermem_not_loaded": (
        "nvidia_peermem did not load: GPUDirect RDMA is unavailable on this node (NCCL over InfiniBand falls back "
        "or fails) while the GPUs look fine",
        "rebuild or reinstall nvidia-peermem against the running ib_core (after any MLNX_OFED / DOCA-OFED change), "
        "then load in order: the InfiniBand stack, the NVIDIA driver, nvidia_peermem; reboot if stale module state "
        "remains",
        False),
    "gpu_reset_required_unattributed": (
        "the driver marked a GPU for reset without naming it",
        "reset the GPUs (nvidia-smi -r) or reboot, then read the node again",
        True),
    "gpu_not_supported_by_driver": (
        "the loaded driver refused a GPU at probe time",
        "install a driver branch that supports the GPU (the driver role resolves driver_branch against the "
        "node's architectures), or roll the node back to its last known-good driver",
        False),
    "nvswitch_fatal": (
        "a fatal NVSwitch error (SXid) took down part of the NVLink fabric",
        "re-initialise the fabric: reboot the node (or restart nvidia-fabricmanager with the GPUs reset) and "
        "verify it again; inspect the switch tray and NVLink cables if the same links fail again",
        True),
}

#: Health verdicts, best first (node_health's ``state``).
STATES = ("healthy", "degraded", "unknown", "unhealthy")

#: Clocks event reasons (facts_model.CLOCKS_EVENT_REASON_BITS names) that mean the hardware holds the
#: clocks down: the GPU is degraded. Idle, application clocks, the software power cap, sync boost and
#: the display clock are the GPU doing what it was told and are not judged.
DEGRADING_CLOCKS_EVENT_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
                                  "sw_thermal_slowdown")

#: Fabric states of a GPU that can run CUDA (``gpus[].fabric``; ``None``: no fabric, e.g. PCIe GPUs).
_FABRIC_READY_STATES = (None, "completed", "not_supported")
_FABRIC_READY_STATUS = (None, "success", "n/a")


def _signal(source: str, action: str, reason: str, fatal: bool = False) -> Dict[str, Any]:
    return {"source": source, "action": action, "reason": reason, "fatal": fatal}


def _xid_signals(facts: Mapping[str, Any], bus: Optional[str], ignore: set) -> List[Dict[str, Any]]:
    signals = []
    for event in facts.get("xid_events") or []:
        if event.get("pci_bus_id") != bus or bus is None or event.get("xid") in ignore:
            continue
        action = event.get("action")
        if action in UNUSABLE_ACTIONS or event.get("fatal"):
            signals.append(_signal("xid", action if action in UNUSABLE_ACTIONS else "reboot", "Xid %s (%s): %s" % (
                event.get("xid"), event.get("name") or "?", event.get("message") or ""), bool(event.get("fatal"))))
    return signals


def gpu_signals(gpu: Mapping[str, Any], facts: Optional[Mapping[str, Any]] = None,
                ignore_xids: Iterable[Any] = ()) -> List[Dict[str, Any]]:
    """Every signal that this GPU is not usable for new work as it is.

    :param gpu: a GPU record of ``ansible_facts.nvidia.gpus``.
    :param facts: the whole facts document (its ``xid_events`` and ``driver_messages`` are
        matched to the GPU by PCI bus id), or ``None``.
    :param ignore_xids: Xid numbers not to count (a rollout's ``ignore_xids``).
    :returns: ``[{"source": "xid" | "driver_message" | "field" (an NVML or nvidia-smi value) | "nvidia-smi" (its "[GPU requires reset]"), "action": one of
        :data:`UNUSABLE_ACTIONS`, "reason": str, "fatal": bool (a fatal Xid)}]``; ``[]`` for a
        usable GPU.
    :raises: nothing.
    """
    facts = facts or {}
    ignore = set(int(x) for x in ignore_xids)
    bus = gpu.get("pci_bus_id")
    signals = _xid_signals(facts, bus, ignore)
    for message in facts.get("driver_messages") or []:
        if bus is not None and message.get("pci_bus_id") == bus:
            reason = message.get("message") or ""
            if message.get("kind") == "gpu_init_failed":
                reason += "; the driver could not initialise it: reset it (power-cycle the node) and read it again"
            signals.append(_signal("driver_message", "reset_gpu", reason))
    fabric = gpu.get("fabric") or {}
    state = fabric.get("state")
    status = (fabric.get("status") or None) and str(fabric["status"]).lower()
    if state not in _FABRIC_READY_STATES or (state == "completed" and status not in _FABRIC_READY_STATUS):
        signals.append(_signal("field", "reset_gpu", "GPU fabric state %s%s: the GPU has not registered with the "
                               "NVLink fabric and cannot run CUDA; start or fix nvidia-fabricmanager (NVLSM and the IB "
                               "modules on NVLink5 systems), then reset the GPU (nvmlDeviceGetGpuFabricInfo)" % (
                                   state, ", status %s" % fabric.get("status") if fabric.get("status") else "")))
    if not gpu.get("readable", True):
        signals.append(_signal("field", "reboot", "GPU unreadable (%s)" % ", ".join(gpu.get("errors") or ["?"])))
    if "GpuRequiresReset" in (gpu.get("errors") or []):
        signals.append(_signal("nvidia-smi", "reset_gpu", "nvidia-smi prints [GPU requires reset]"))
    rows = gpu.get("remapped_rows") or {}
    if rows.get("failed"):
        signals.append(_signal("field", "hardware_inspection", "row remapping failed (nvmlDeviceGetRemappedRows)"))
    elif rows.get("pending"):
        signals.append(_signal("field", "reset_gpu", "a row remapping waits for a GPU reset (nvmlDeviceGetRemappedRows)"))
    if (gpu.get("retired_pages") or {}).get("pending"):
        signals.append(_signal("field", "reset_gpu",
                               "a page retirement waits for a GPU reset (nvmlDeviceGetRetiredPagesPendingStatus)"))
    recovery = (gpu.get("extended") or {}).get("recovery_action")
    if recovery and recovery != "none":
        signals.append(_signal("field", _RECOVERY_TO_ACTION.get(recovery, "reset_gpu"),
                               "NVML recovery action: %s (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)" % recovery))
    return signals


def _problem(kind: str, detail: str, evidence: List[str]) -> Dict[str, Any]:
    meaning, remedy, reboot_fixes = NODE_PROBLEMS[kind]
    return {"kind": kind, "reason": "%s: %s" % (meaning, detail) if detail else meaning,
            "remedy": remedy, "reboot_fixes": reboot_fixes, "evidence": evidence}


def node_problems(facts: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Problems of the node as a whole, each with its remedy.

    :param facts: ``ansible_facts.nvidia`` (``node.module_load_failures``, ``driver.not_loaded_cause``,
        ``driver_messages``, ``sxid_events``).
    :returns: ``[{"kind": a key of :data:`NODE_PROBLEMS`, "reason": str, "remedy": str,
        "reboot_fixes": bool, "evidence": [log lines]}]``.
    :raises: nothing.
    """
    problems = []
    node = facts.get("node") or {}
    for failure in node.get("module_load_failures") or []:
        evidence = [failure.get("first_line") or ""]
        if failure.get("reason") == "signature_rejected":
            signer = node.get("module_signer")
            problems.append(_problem("module_signature_rejected", "signer %s" % (signer or "none (unsigned)"), evidence))
        elif failure.get("module") == "nvidia_peermem":
            detail = failure.get("reason", "").replace("_", " ")
            if failure.get("symbols"):
                detail += " with the loaded kernel modules (%s)" % ", ".join(failure["symbols"])
            if failure.get("error") is not None:
                detail += ", error %s" % failure["error"]
            problems.append(_problem("peermem_not_loaded", detail, evidence))
        else:
            problems.append(_problem("companion_module_not_loaded", "%s: %s" % (
                failure.get("module"), failure.get("reason", "").replace("_", " ")), evidence))
    driver = facts.get("driver") or {}
    if driver.get("not_loaded_cause") == "module_signature_rejected" and not any(
            p["kind"] == "module_signature_rejected" for p in problems):
        signer = node.get("module_signer")
        problems.append(_problem("module_signature_rejected", "Secure Boot is on and the module built for the running "
                                 "kernel (signer %s) is not loaded" % (signer or "none: unsigned"),
                                 list(driver.get("state_reasons") or [])[:2]))
    for failure in node.get("probe_failures") or []:
        what = {"not_supported": "not supported by this driver release",
                "open_unsupported": "not supported by the open kernel modules (no GSP)",
                "open_required": "needs the open kernel modules",
                "legacy": "supported only by the %s legacy drivers" % failure.get("legacy_branch")}.get(
                    failure.get("reason"), failure.get("reason"))
        problems.append(_problem("gpu_not_supported_by_driver", "GPU %s%s: %s" % (
            failure.get("pci_bus_id") or failure.get("gpu_name") or "?",
            " (PCI ID %s)" % failure["pci_id"] if failure.get("pci_id") else "", what), [failure.get("first_line") or ""]))
    fatal_sxids = [event for event in facts.get("sxid_events") or [] if event.get("fatal")]
    if fatal_sxids:
        switches = sorted(set(str(event.get("pci_bus_id")) for event in fatal_sxids))
        records = sum(int(event.get("fatal_records") or 0) for event in fatal_sxids)
        problems.append(_problem("nvswitch_fatal", "%d fatal SXid record(s) (SXid %s) on NVSwitch(es) %s" % (
            records, ", ".join(sorted(set(str(event.get("sxid")) for event in fatal_sxids))), ", ".join(switches)),
            [event.get("first_line") or "" for event in fatal_sxids[:3]]))
    unattributed = [m for m in facts.get("driver_messages") or [] if m.get("pci_bus_id") is None]
    if unattributed:
        problems.append(_problem("gpu_reset_required_unattributed", unattributed[0].get("message") or "",
                                 [m.get("first_line") or "" for m in unattributed[:3]]))
    return problems


def unlisted_gpus(facts: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """GPUs the kernel log names that no GPU record lists: lost since, or never read.

    After a GPU falls off the bus and the node reboots, NVML and nvidia-smi list the others only
    (and renumber them), while the kernel log still names the lost one by PCI bus id; a bundle
    with nothing but a kernel log lists no GPU at all (field case 06).

    :param facts: ``ansible_facts.nvidia`` (``gpus``, ``xid_events``, ``driver_messages`` and
        ``kernel_log_gpus``: the UUID and serial the driver printed per bus id).
    :returns: ``[{"index": None, "pci_bus_id": str, "uuid": str or None, "serial": str or None,
        "listed": False}]``, in the order the bus ids first appear.
    :raises: nothing.
    """
    listed = set(gpu.get("pci_bus_id") for gpu in facts.get("gpus") or [])
    known = dict((entry.get("pci_bus_id"), entry) for entry in facts.get("kernel_log_gpus") or [])
    out = []  # type: List[Dict[str, Any]]
    seen = set()
    for entry in list(facts.get("xid_events") or []) + list(facts.get("driver_messages") or []):
        bus = entry.get("pci_bus_id")
        if bus is None or bus in listed or bus in seen:
            continue
        seen.add(bus)
        identity = known.get(bus) or {}
        out.append({"index": None, "pci_bus_id": bus, "uuid": identity.get("uuid"),
                    "serial": identity.get("serial"), "listed": False})
    return out


def degraded_gpus(facts: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """GPUs whose clocks the hardware holds down as they were read (:data:`DEGRADING_CLOCKS_EVENT_REASONS`).

    :param facts: ``ansible_facts.nvidia`` (``gpus[].clocks_event_reasons``: names, or ``None`` when
        not read).
    :returns: ``[{"index", "pci_bus_id", "uuid", "serial", "reasons": [names]}]``.
    :raises: nothing.
    Source: NVML ``nvmlDeviceGetCurrentClocksEventReasons`` (HwSlowdown, HwThermalSlowdown,
    HwPowerBrakeSlowdown, SwThermalSlowdown).
    """
    out = []
    for gpu in facts.get("gpus") or []:
        reasons = [r for r in gpu.get("clocks_event_reasons") or [] if r in DEGRADING_CLOCKS_EVENT_REASONS]
        if reasons:
            out.append({"index": gpu.get("index"), "pci_bus_id": gpu.get("pci_bus_id"), "uuid": gpu.get("uuid"),
                        "serial": gpu.get("serial"), "reasons": reasons})
    return out


def unknown_signals(facts: Mapping[str, Any]) -> List[str]:
    """What was not understood well enough to call the node healthy.

    :param facts: ``ansible_facts.nvidia`` (``kernel_log_unrecognised``: kernel_log_coverage).
    :returns: reasons, e.g. ``["2 kernel-log line(s) of the NVIDIA modules at error level that no rule
        reads: [  81.9] NVRM: GPU0 ...; ..."]``; ``[]`` when everything was read.
    :raises: nothing.
    """
    reasons = []
    unrecognised = facts.get("kernel_log_unrecognised") or {}
    errors = int(unrecognised.get("error_count") or 0)
    if errors:
        lines = [entry.get("line") or "" for entry in unrecognised.get("lines") or [] if entry.get("level") == "error"]
        reasons.append("%d kernel-log line(s) of the NVIDIA modules at error level that no rule reads: %s" % (
            errors, "; ".join(lines[:3]) or "(not kept)"))
    return reasons


def node_health(facts: Optional[Mapping[str, Any]], ignore_xids: Iterable[Any] = (),
                include_unlisted: bool = True) -> Dict[str, Any]:
    """The usable / not usable verdict of every GPU and of the node.

    :param facts: ``ansible_facts.nvidia``, or ``None``.
    :param ignore_xids: Xid numbers not to count.
    :param include_unlisted: also judge the GPUs that only the kernel log names
        (:func:`unlisted_gpus`); a rollout's verification, which flags a lost GPU by the count
        and the fatal Xid already, passes ``False``.
    :returns: ``{"healthy": bool, "state": one of :data:`STATES`, "gpus": [{"index", "pci_bus_id",
        "uuid", "serial", "listed", "usable": False, "action": the most disruptive action of its
        signals, "signals": [...]}] (only GPUs that are not usable; ``listed`` is false, and ``index``
        ``None``, for a GPU only the kernel log names, see :func:`unlisted_gpus`), "problems":
        node_problems(facts), "unknown": unknown_signals(facts), "degraded": degraded_gpus(facts)}``.
        ``state`` is ``unhealthy`` when a GPU is not usable or the node has a problem, else
        ``unknown`` when something was not understood, else ``degraded`` when a GPU is held down
        by hardware, else ``healthy``; ``healthy`` is true for ``healthy`` alone. ``None`` facts are
        ``unknown``.
    :raises: nothing.
    """
    if not facts:
        return {"healthy": False, "state": "unknown", "gpus": [], "problems": [], "unknown": ["no GPU facts"],
                "degraded": []}
    ignore = list(ignore_xids)
    gpus = []
    for gpu in list(facts.get("gpus") or []) + (unlisted_gpus(facts) if include_unlisted else []):
        signals = gpu_signals(gpu, facts, ignore)
        if signals:
            action = max((s["action"] for s in signals), key=action_rank)
            gpus.append({"index": gpu.get("index"), "pci_bus_id": gpu.get("pci_bus_id"), "uuid": gpu.get("uuid"),
                         "serial": gpu.get("serial"), "listed": gpu.get("listed", True),
                         "usable": False, "action": action, "signals": signals})
    problems = node_problems(facts)
    unknown = unknown_signals(facts)
    degraded = degraded_gpus(facts)
    if gpus or problems:
        state = "unhealthy"
    elif unknown:
        state = "unknown"
    elif degraded:
        state = "degraded"
    else:
        state = "healthy"
    return {"healthy": state == "healthy", "state": state, "gpus": gpus, "problems": problems,
            "unknown": unknown, "degraded": degraded}


def gpu_label(gpu: Mapping[str, Any]) -> str:
    """Name a GPU so that a person pulls the right card: PCI bus id, then serial and UUID.

    The NVML index is not a name: it is the order of enumeration, and a lost GPU renumbers the
    others at the next boot. It is given last, and only when it is all there is.

    :param gpu: a GPU record, or a GPU of :func:`node_health` (``pci_bus_id``, ``serial``,
        ``uuid``, ``index``, any of them ``None``).
    :returns: e.g. ``"GPU 0000:4e:00.0 (serial 1654922000403, GPU-5e1c...)"``,
        ``"GPU 0000:9b:00.0"``, or ``"GPU index 3"`` when no bus id, serial or UUID is known.
    :raises: nothing.
    """
    bus = gpu.get("pci_bus_id")
    ids = []
    if gpu.get("serial"):
        ids.append("serial %s" % gpu["serial"])
    if gpu.get("uuid"):
        ids.append(str(gpu["uuid"]))
    if bus:
        return "GPU %s%s" % (bus, " (%s)" % ", ".join(ids) if ids else "")
    if ids:
        return "GPU %s" % ", ".join(ids)
    return "GPU index %s" % gpu.get("index") if gpu.get("index") is not None else "GPU (unidentified)"


def describe_unusable(verdict: Mapping[str, Any]) -> str:
    """One line naming the unusable GPUs of a :func:`node_health` verdict (by :func:`gpu_label`).

    :returns: e.g. ``"GPU 0000:0b:00.0 (serial 1321..., GPU-...): reset_gpu: Xid 154 ..."``, ``"; "``-joined.
    """
    parts = []
    for gpu in verdict.get("gpus") or []:
        parts.append("%s: %s: %s" % (gpu_label(gpu), gpu.get("action"), gpu["signals"][0]["reason"]))
    return "; ".join(parts)
