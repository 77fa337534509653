# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What to do next with a node a rollout left out of service: the action, what clears its flag, the command.

Every failed, flagged, refused or quarantined node gets one next step, in the rollout report and
in the node's flag file (``/etc/ansible/facts.d/gpufleet_rollout.fact``):

* ``do``: the catalog's action for its signal, on the GPU it names (PCI bus id, serial): an Xid's
  action from the Xid catalog (``xid_catalog.classify``: reset the GPU, reboot, inspect the
  hardware), escalated to "reseat it, or RMA it by its serial" when the reboot it asks for was done
  and the GPU is still lost; a node problem's remedy (``gpu_health.NODE_PROBLEMS``: enroll the
  signing key, rebuild the module); else the driver transaction or verification the reason names;
* ``clears``: what clears the flag (a verified rollback, ``playbooks/rollback.yml``, which also
  undrains the node; nothing for a node that was not flagged);
* ``command``: the exact command that does it (``ansible-playbook gpufleet.nvidia.rollback -i
  <inventory> -e rollback_hosts=<node>``), and ``resume``: the one that takes the node back into
  the rollout (the same rollout again, same ``rollout_id``).

Controller side; pure functions over a record (``rollout_report``) whose node facts are untrusted:
values of a wrong type are ignored, never raised on.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_health import gpu_label
from ansible_collections.gpufleet.nvidia.plugins.module_utils.xid_catalog import action_rank, classify

#: The node's flag file (node_upgrade's ``__node_upgrade_flag_file``).
FLAG_FILE = "/etc/ansible/facts.d/gpufleet_rollout.fact"

#: Verdict flags that point at the hardware rather than at the driver (rollout_verdict.FLAGS).
HARDWARE_FLAGS = ("gpu_count_changed", "gpu_unreadable", "gpu_identity_changed", "no_gpus")

_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> List[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def commands(record: Mapping[str, Any], inventory: Any = None) -> Dict[str, str]:
    """The commands that act on this node: ``{"rollback", "rollout"}``.

    :param record: ``node``, ``rollout_id`` (left out of the rollout command for ``stage``
        ``rollback``: rollback.yml's id), ``target.requested`` (the ``driver_version`` or
        ``driver_branch`` the rollout was run with).
    :param inventory: the run's inventory sources (``ansible_inventory_sources``: a path or a list
        of them); ``None``: ``<inventory>``.
    :returns: ``rollback``: ``ansible-playbook gpufleet.nvidia.rollback -i INV -e rollback_hosts=NODE``
        (playbooks/rollback.yml: ``rollback_hosts`` is its host pattern; ``--limit`` would also
        leave out its report play on localhost); ``rollout``: ``ansible-playbook gpufleet.nvidia.rollout
        -i INV -e rollout_id=ID -e driver_branch=B`` (or ``driver_version=V``), every value quoted
        for a POSIX shell.
    """
    sources = [inventory] if isinstance(inventory, str) else [s for s in _list(inventory) if isinstance(s, str)]
    inv = " ".join("-i %s" % shlex.quote(source) for source in sources) or "-i <inventory>"
    node = _text(record.get("node")) or "NODE"
    rollout = ["ansible-playbook gpufleet.nvidia.rollout", inv]
    # A record of rollback.yml carries its rollback_id, which no rollout resumes.
    if _text(record.get("rollout_id")) and record.get("stage") != "rollback":
        rollout.append("-e rollout_id=%s" % shlex.quote(record["rollout_id"]))
    requested = _text(_mapping(record.get("target")).get("requested"))
    if requested:
        rollout.append("-e %s=%s" % ("driver_version" if _VERSION.match(requested) else "driver_branch",
                                     shlex.quote(requested)))
    return {"rollback": "ansible-playbook gpufleet.nvidia.rollback %s -e rollback_hosts=%s" % (inv, shlex.quote(node)),
            "rollout": " ".join(rollout)}


def _gpu_step(gpu: Mapping[str, Any], rebooted: bool) -> Dict[str, Any]:
    """The catalog's action on one GPU (an entry of the record's ``gpus``), as a sentence."""
    label = _text(gpu.get("gpu")) or gpu_label(gpu)
    serial = _text(gpu.get("serial"))
    action = _text(gpu.get("action"))
    why = _text(gpu.get("problem"))
    rma = "RMA it by its serial %s" % serial if serial else "RMA it (its serial is in nvidia-smi -q or the snapshot)"
    if action == "reboot" and rebooted:
        # The catalog's reboot was done (the transaction's own) and the GPU is still not usable.
        action = "hardware_inspection"
        why += "; still there after the node's reboot"
    if action == "hardware_inspection":
        text = "reseat %s and check its power and riser, or %s if the fault comes back" % (label, rma)
    elif action == "reboot":
        text = "reboot the node (the catalog's action for %s); reseat the GPU or %s if the fault comes back" % (label, rma)
    elif action == "reset_gpu":
        bus = _text(gpu.get("pci_bus_id")) or "<bus id>"
        text = "reset %s (nvidia-smi -r -i %s, with no process on it) or reboot the node" % (label, bus)
    elif action == "check_application":
        text = "check the application that ran on %s" % label
    else:
        text = "look at %s" % label
    return {"action": action or "inspect", "text": "%s (%s)" % (text, why) if why else text}


def _xid_gpus(record: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The new fatal Xids as GPU entries when the record names no GPU: their catalog action and name."""
    out = []
    for xid in sorted((x for x in _mapping(record.get("new_fatal_xids")) if str(x).isdigit()), key=int):
        entry = classify(int(xid))
        out.append({"gpu": "the GPU the reason names", "action": entry["action"],
                    "problem": "Xid %s (%s; NVIDIA: %s)" % (xid, entry["name"], entry["nvidia_immediate"])})
    return out


def next_step(record: Mapping[str, Any], inventory: Any = None) -> Optional[Dict[str, str]]:
    """The next step of a node the rollout left out of service.

    :param record: a rollout record (``rollout_report``): ``node``, ``result``, ``flags``,
        ``reason``, ``rollout_id``, ``target.requested``, ``rollback`` ``{version, ok}``,
        ``new_fatal_xids`` ``{xid: count}``, ``gpus`` (:func:`gpu_problems`: the GPUs that are not
        usable, each with its catalog ``action``, ``serial``, ``pci_bus_id``, ``problem``),
        ``problems`` (gpu_health node problems: ``kind``, ``remedy``), ``marks`` (``rebooted``).
    :param inventory: the run's ``ansible_inventory_sources`` (for the commands).
    :returns: ``None`` for a node in service (``upgraded``, ``skipped``, ``not_started``) or waiting
        for its reboot (``pending``); else ``{"action": the catalog action or problem kind that
        decides it (``hardware_inspection``, ``reset_gpu``, ``reboot``, a node problem's kind,
        ``driver``, ``preflight``, ``reconnect``), "do": str, "clears": str, "command": str,
        "resume": str}``.
    :raises: nothing.
    """
    result = _text(record.get("result"))
    if result in ("", "upgraded", "skipped", "not_started", "pending"):
        return None if result else _driver_step(record, inventory)
    cmd = commands(record, inventory)
    flags = set(f for f in _list(record.get("flags")) if isinstance(f, str))
    if result == "refused":
        if "flagged" in flags:
            return {"action": "clear_rollout_flag",
                    "do": "nothing was changed: the node carries the flag of an earlier failed rollout; fix what the "
                          "flag's reason names (cat %s on the node)" % FLAG_FILE,
                    "clears": "a verified rollback (rollback.yml) clears the flag and undrains the node",
                    "command": cmd["rollback"], "resume": cmd["rollout"]}
        cause = _text(record.get("reason")) or ", ".join(sorted(flags)) or "see the reason"
        return {"action": "preflight", "do": "nothing was changed; remove the cause the preflight names (%s)" % cause,
                "clears": "no flag was written: the node only needs the rollout again",
                "command": cmd["rollout"], "resume": cmd["rollout"]}
    if result in ("unreachable", "interrupted"):
        return {"action": "reconnect",
                "do": "bring the node back (console or BMC) and find why it %s" % (
                    "stopped answering" if result == "unreachable" else "lost its connection"),
                "clears": "no flag was written; the same rollout_id takes over the node's lock and resumes it from "
                          "its snapshot (rollback.yml returns it to its last known-good driver instead)",
                "command": cmd["rollout"], "resume": cmd["rollout"]}
    return _driver_step(record, inventory)


def _driver_step(record: Mapping[str, Any], inventory: Any) -> Dict[str, str]:
    cmd = commands(record, inventory)
    flags = set(f for f in _list(record.get("flags")) if isinstance(f, str))
    rollback = _mapping(record.get("rollback"))
    rebooted = "rebooted" in _mapping(record.get("marks")) or bool(rollback.get("version") and record.get("after"))
    gpus = [g for g in _list(record.get("gpus")) if isinstance(g, Mapping)]
    if not gpus and (flags & set(HARDWARE_FLAGS) or record.get("new_fatal_xids")):
        gpus = _xid_gpus(record)
    steps = [_gpu_step(gpu, rebooted) for gpu in gpus]
    problems = [p for p in _list(record.get("problems")) if isinstance(p, Mapping) and _text(p.get("remedy"))]
    where = ("on %s" % rollback["version"]) if _text(rollback.get("version")) and record.get("result") == "rolled_back" \
        else "drained"
    clears = ("a verified rollback clears the flag (%s) and undrains the node: rollback.yml verifies it on its last "
              "known-good driver" % FLAG_FILE)
    if steps:
        worst = max(steps, key=lambda s: action_rank(s["action"]))
        do = "; ".join(s["text"] for s in sorted(steps, key=lambda s: -action_rank(s["action"])))
        return {"action": worst["action"], "do": "%s; the node stays %s until then" % (do, where),
                "clears": clears + " once the GPU is fixed" + _replaced_hint(gpus, cmd["rollback"]),
                "command": cmd["rollback"], "resume": cmd["rollout"]}
    if flags & set(HARDWARE_FLAGS):
        return {"action": "hardware_inspection",
                "do": "look at the GPUs the reason names (%s): reseat the one it names by bus id, or RMA it by its "
                      "serial if the fault comes back" % ", ".join(sorted(flags & set(HARDWARE_FLAGS))),
                "clears": clears + " once the GPU is fixed", "command": cmd["rollback"], "resume": cmd["rollout"]}
    if "health_unknown" in flags:
        return {"action": "read_unrecognised",
                "do": "read the kernel-log lines of the NVIDIA modules that the reason lists: no rule of this "
                      "collection reads them, so the node could not be verified; fix what they name (or report the "
                      "lines), the node stays %s until then" % where,
                "clears": clears, "command": cmd["rollback"], "resume": cmd["rollout"]}
    if "gpu_degraded" in flags:
        return {"action": "check_clocks",
                "do": "look at the cooling and power delivery of the GPUs the reason names (their clocks are held "
                      "down by hardware: HW slowdown, power brake or thermal); the node stays %s until then" % where,
                "clears": clears, "command": cmd["rollback"], "resume": cmd["rollout"]}
    if problems:
        first = problems[0]
        return {"action": _text(first.get("kind")) or "node_problem", "do": _text(first.get("remedy")),
                "clears": clears, "command": cmd["rollback"], "resume": cmd["rollout"]}
    if record.get("result") == "rolled_back":
        do = ("the node is back on %s, verified, drained and flagged: find why the target failed (the reason) "
              "before a new attempt" % (_text(rollback.get("version")) or "its last known-good driver"))
    else:
        do = "fix what the reason names (the driver transaction or its verification: a module build, a version " \
             "not loaded, the policy, the benchmark)"
    return {"action": "driver", "do": do, "clears": clears, "command": cmd["rollback"], "resume": cmd["rollout"]}


def _replaced_hint(gpus: List[Mapping[str, Any]], rollback: str) -> str:
    """How the rollback accepts a GPU replaced by an RMA: its slot named, the new UUID and serial allowed."""
    buses = sorted(set(_text(g.get("pci_bus_id")) for g in gpus
                       if _text(g.get("pci_bus_id")) and _text(g.get("action")) in ("hardware_inspection", "reboot")))
    if not buses:
        return ""
    return (" (a GPU replaced by an RMA has a new UUID and serial, which the verification refuses unless its slot "
            "is named: %s -e rollback_replaced_gpus=%s)" % (rollback, shlex.quote(",".join(buses))))


def next_step_text(step: Optional[Mapping[str, Any]]) -> Optional[str]:
    """One sentence of a :func:`next_step`: ``"<do>; <clears>: <command>; then <resume> takes it back into
    the rollout"``; ``None`` for ``None``."""
    if not isinstance(step, Mapping):
        return None
    text = "%s; %s: %s" % (step.get("do"), step.get("clears"), step.get("command"))
    if step.get("resume") and step.get("resume") != step.get("command"):
        text += "; then %s takes it back into the rollout" % step["resume"]
    return text


def gpu_problems(facts: Any, before: Any = None) -> List[Dict[str, Any]]:
    """The GPUs of a node that are not usable, compact, for its record and its next step.

    :param facts: ``ansible_facts.nvidia`` now (its ``headline.gpus``: facts_headline.node_headline).
    :param before: the snapshot's facts (``gpus``: their serials and UUIDs), or ``None``.
    :returns: ``[{"gpu" (gpu_label), "pci_bus_id", "serial", "uuid", "index", "problem", "action"
        (an xid_catalog action), "fatal"}]``: the headline's GPUs, a GPU's missing serial and UUID
        taken from the snapshot by PCI bus id (a GPU that fell off the bus is known by the kernel log's
        bus id only), then each GPU of the snapshot that is gone (``hardware_inspection``).
    :raises: nothing.
    """
    facts = _mapping(facts)
    before_gpus = [g for g in _list(_mapping(before).get("gpus")) if isinstance(g, Mapping)]
    by_bus = dict((g.get("pci_bus_id"), g) for g in before_gpus if g.get("pci_bus_id"))
    out = []  # type: List[Dict[str, Any]]
    for gpu in _list(_mapping(facts.get("headline")).get("gpus")):
        if not isinstance(gpu, Mapping):
            continue
        known = _mapping(by_bus.get(gpu.get("pci_bus_id")))
        entry = {"pci_bus_id": gpu.get("pci_bus_id"), "serial": gpu.get("serial") or known.get("serial"),
                 "uuid": gpu.get("uuid") or known.get("uuid"), "index": gpu.get("index"),
                 "problem": _text(gpu.get("problem")), "action": _text(gpu.get("action")), "fatal": bool(gpu.get("fatal"))}
        entry["gpu"] = gpu_label(entry)
        out.append(entry)
    now = _list(facts.get("gpus"))
    buses = set(g.get("pci_bus_id") for g in now if isinstance(g, Mapping)) | set(e["pci_bus_id"] for e in out)
    uuids = set(g.get("uuid") for g in now if isinstance(g, Mapping) and g.get("uuid"))
    for gpu in before_gpus:
        if gpu.get("pci_bus_id") and gpu["pci_bus_id"] not in buses and gpu.get("uuid") not in uuids:
            entry = {"pci_bus_id": gpu.get("pci_bus_id"), "serial": gpu.get("serial"), "uuid": gpu.get("uuid"),
                     "index": gpu.get("index"), "problem": "gone since the snapshot", "action": "hardware_inspection",
                     "fatal": True}
            entry["gpu"] = gpu_label(entry)
            out.append(entry)
    return out
