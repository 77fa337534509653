# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What an operator reads first: the node's verdict, the worst problem per GPU, the next step.

``ansible_facts.nvidia.headline`` condenses the facts document into one short block. It says
only what the evidence says: a fact that could not be read makes the verdict ``unknown`` and
is listed under ``unknown``; it never counts as 0 or as healthy. GPUs are named by PCI bus id,
serial and UUID (:func:`gpu_health.gpu_label`), never by their NVML index alone, which is the
order of enumeration and changes when a GPU is lost.

Pure functions over the facts document (docs/facts.md, "headline"). Sources: the driver
verdict (driver_state.driver_state), the health verdict (gpu_health.node_health), NVIDIA's
Xid catalog resolutions (xid_catalog.ACTIONS). Compatible with Python 3.7.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_health import gpu_label
from ansible_collections.gpufleet.nvidia.plugins.module_utils.xid_catalog import action_rank

#: Verdicts of a node, from best to worst knowledge.
VERDICTS = ("healthy", "degraded", "unhealthy", "unknown")

#: Driver states that need an action, and that action (facts_model.DRIVER_STATES).
DRIVER_ACTIONS = {
    "not_installed": "install_driver",
    "not_loaded": "load_driver",
    "reboot_pending": "reboot",
    "broken": "reinstall_driver",
}

#: Action → what to do, for the ``next_step`` sentence. ``%s`` is the GPU (or the node).
_STEPS = {
    "reset_gpu": "drain the node, reset %s (nvidia-smi -r -i <bus id>) or reboot the node, then read the facts again",
    "reboot": "drain the node and reboot it, then read the facts again",
    "hardware_inspection": "drain the node and have %s inspected: reseat it, or RMA it by its serial if the fault "
                           "comes back",
    "install_driver": "install the NVIDIA driver (gpufleet.nvidia.driver role)",
    "load_driver": "load the nvidia kernel module (modprobe nvidia) or reboot",
    "reinstall_driver": "reinstall the driver for the running kernel (a reboot will not fix it)",
    "read_unrecognised": "read the kernel-log lines listed under kernel_log_unrecognised: no rule of this "
                         "collection reads them; drain the node if they name a fault, and report the lines",
    "check_clocks": "look at cooling and power delivery of %s (its clocks are held down by hardware); drain it if "
                    "it stays slow",
    "clear_rollout_flag": "fix what the flag's reason names, then run playbooks/rollback.yml --limit <node>: it "
                          "verifies the node, clears the flag and undrains it",
}


def _worst_signal(signals: List[Mapping[str, Any]]) -> Mapping[str, Any]:
    return max(signals, key=lambda signal: (bool(signal.get("fatal")), action_rank(signal.get("action"))))


def _unknowns(facts: Mapping[str, Any]) -> List[str]:
    driver = facts.get("driver") or {}
    unknown = []
    if facts.get("gpu_count") is None:
        unknown.append("gpu_count")
    if driver.get("state") is None:
        unknown.append("driver.state")
    for key in ("userspace_version", "loaded_version"):
        if driver.get(key) is None:
            unknown.append("driver.%s" % key)
    return unknown


def node_headline(facts: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The headline of a facts document.

    :param facts: ``ansible_facts.nvidia`` with its ``health`` (gpu_health.node_health) and
        ``driver`` sections, or ``None``.
    :returns: ``{"verdict": one of :data:`VERDICTS`, "summary": str (one sentence),
        "gpus": [{"gpu": str (gpu_label), "pci_bus_id", "serial", "uuid", "index" (None for a GPU
        only the kernel log names), "listed": bool, "problem": str (the worst signal, short: "Xid 119
        (GSP RPC timeout)"), "evidence": str (its whole reason), "action": str (xid_catalog
        action; ``hardware_inspection`` for a GPU the kernel log names that the GPU source, which
        answered, does not list), "fatal": bool}] (only GPUs that are not usable, worst first),
        "node_problems": [str], "action": str or None (the most disruptive action: an
        xid_catalog action, a :data:`DRIVER_ACTIONS` value, or a node problem's kind),
        "next_step": str or None, "unknown": [dotted keys that could not be read]}``. A node a
        rollout flagged (``rollout.flagged``, rollout_marks) has the flag as a node problem.
        ``verdict`` is ``unhealthy`` when a GPU is not usable, the node has a problem or the
        driver state needs an action; else ``unknown`` when the GPU count or the driver state
        could not be read, or a kernel-log line of the NVIDIA modules at error level was not
        understood (``kernel_log_unrecognised`` in ``unknown``); else ``degraded`` when a GPU's
        clocks are held down by hardware (gpu_health.degraded_gpus); else ``healthy``.
    :raises: nothing.
    """
    facts = facts or {}
    health = facts.get("health") or {}
    driver = facts.get("driver") or {}
    gpus = []
    for gpu in health.get("gpus") or []:
        worst = _worst_signal(gpu.get("signals") or [{"action": gpu.get("action"), "reason": ""}])
        reason = worst.get("reason") or ""
        # An Xid signal reads "Xid 119 (GSP RPC timeout): <the driver's message>": the head is the problem.
        problem = reason.split(": ", 1)[0] if worst.get("source") == "xid" else reason
        action = gpu.get("action")
        if gpu.get("listed") is False and facts.get("gpu_count") is not None:
            # NVML or nvidia-smi answered and does not list a GPU the kernel log names: it is gone
            # from the bus (since the boot, or before it), which a reset or reboot did not bring back.
            problem = "not listed by %s; kernel log: %s" % (facts.get("source") or "the GPU source", problem)
            action = "hardware_inspection"
        gpus.append({"gpu": gpu_label(gpu), "pci_bus_id": gpu.get("pci_bus_id"), "serial": gpu.get("serial"),
                     "uuid": gpu.get("uuid"), "index": gpu.get("index"), "listed": gpu.get("listed", True),
                     "problem": problem, "evidence": reason, "action": action,
                     "fatal": bool(worst.get("fatal"))})
    gpus.sort(key=lambda entry: (not entry["fatal"], -action_rank(entry["action"])))
    problems = list(health.get("problems") or [])
    rollout = facts.get("rollout") or {}
    if rollout.get("flagged"):
        problems.append({"kind": "clear_rollout_flag", "remedy": _STEPS["clear_rollout_flag"],
                         "reason": "flagged by rollout %s%s: %s" % (
                             rollout.get("rollout_id") or "?",
                             " (stage %s)" % rollout["stage"] if rollout.get("stage") else "",
                             rollout.get("reason") or "no reason recorded")})
    driver_action = DRIVER_ACTIONS.get(driver.get("state"))
    unknown = _unknowns(facts)

    next_step = None  # type: Optional[str]
    action = None  # type: Optional[str]
    if gpus:
        first = gpus[0]
        action = first["action"]
        step = _STEPS.get(action, "drain the node and look at %s")
        next_step = step % first["gpu"] if "%s" in step else step
    elif problems:
        action = problems[0].get("kind")
        next_step = problems[0].get("remedy")
    elif driver_action:
        action = driver_action
        next_step = _STEPS[driver_action]

    not_read = list(health.get("unknown") or [])
    if not_read:
        unknown.append("kernel_log_unrecognised")
    degraded = list(health.get("degraded") or [])
    if not gpus and not problems and not driver_action:
        if not_read:
            action, next_step = "read_unrecognised", _STEPS["read_unrecognised"]
        elif degraded:
            action = "check_clocks"
            next_step = _STEPS["check_clocks"] % gpu_label(degraded[0])

    if gpus or problems or driver_action:
        verdict = "unhealthy"
    elif "gpu_count" in unknown or "driver.state" in unknown or not_read:
        verdict = "unknown"
    elif degraded:
        verdict = "degraded"
    else:
        verdict = "healthy"

    count = facts.get("gpu_count")
    parts = []
    if gpus:
        listed = "of %d listed" % count if count is not None else "GPU count unknown"
        parts.append("%d GPU(s) not usable (%s): %s" % (
            len(gpus), listed, "; ".join("%s: %s" % (g["gpu"], g["problem"]) for g in gpus[:3])))
    for problem in problems[:2]:
        parts.append(problem.get("reason") or problem.get("kind") or "")
    if driver_action:
        parts.append("driver %s" % driver.get("state"))
    if not parts and not_read:
        parts.extend(not_read[:1])
    if not parts and degraded:
        parts.append("%s held down by hardware (%s)" % (gpu_label(degraded[0]), ", ".join(degraded[0]["reasons"])))
    if not parts:
        if verdict == "healthy":
            parts.append("%d GPU(s) usable, driver %s" % (count, driver.get("userspace_version")
                                                          or driver.get("loaded_version") or "?"))
        else:
            parts.append("not enough evidence: %s could not be read" % ", ".join(unknown))
    summary = "%s: %s." % (verdict, "; ".join(parts))
    return {"verdict": verdict, "summary": summary, "gpus": gpus,
            "node_problems": [p.get("reason") for p in problems], "action": action,
            "next_step": next_step, "unknown": unknown}
