# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A MIG layout change on a Slurm node is a change of the node's Slurm resources (field case 46).

Slurm counts a GPU in MIG mode as one ``gres/gpu`` per MIG device (gres.conf(5), ``MultipleFiles``
for "a card with Multi-Instance GPU functionality"; ``AutoDetect=nvml`` finds them at slurmd's start).
When the count slurmd registers differs from the node's ``Gres=gpu:<n>`` in slurm.conf, Slurm 22.05
does one of two things, both seen on the simulated fleet's real slurmctld and slurmd:

* fewer: slurmctld logs ``_node_config_validate: gres/gpu: Count changed on node N (4 != 3)``, sets
  the node INVAL with the reason ``gres/gpu count reported lower than configured (3 < 4)`` and
  drains it (``drain_nodes``); the registration is refused (``Invalid argument``);
* more: slurmd logs ``A line in gres.conf for GRES gpu:... has 1 more configured than expected in
  slurm.conf. Ignoring extra GRES.`` and the node registers the configured count: the extra MIG
  devices are never given to a job, without a word in slurmctld's log.

A count in slurm.conf is not changed by ``scontrol update`` ("Modification of GRES count associated
with specific files (e.g. GPUs) is not allowed other than to set their count on a node to zero",
scontrol(1)) nor by ``scontrol reconfigure`` (seen on 22.05): slurm.conf and gres.conf are edited and
the daemons restarted. So the role that changes a layout drains the node first, applies it, counts
what Slurm will find, and resumes the node only when slurm.conf configures that count and slurmd's
registration was accepted; otherwise the node stays drained with the count to configure.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import scheduler_state

# One GRES of a Gres= list: name[:type][:count][(S:...)]; GPUs are name "gpu".
_GRES_ITEM = re.compile(r"^(?P<name>[A-Za-z0-9_]+)(?::(?P<rest>[^()]*))?(?:\([^)]*\))?$")


def configured_gpus(gres: Optional[str]) -> Optional[int]:
    """The node's configured ``gres/gpu`` count from the ``Gres=`` field of ``scontrol show node``.

    :param gres: e.g. ``gpu:8``, ``gpu:h100:6,gpu:3g.40gb:2``, ``gpu:4(S:0-1),nic:1`` (slurm.conf(5)
        ``Gres``: "name[:type][:count]", count 1 when left out); None or ``(null)``: no GRES.
    :returns: the sum of the ``gpu`` counts (0 when the node has no GPU GRES); None when a ``gpu``
        item cannot be read (its count is neither a number nor left out).
    """
    if gres in (None, "", "(null)"):
        return 0
    total = 0
    for item in re.split(r",(?![^(]*\))", str(gres)):  # commas inside (S:0,2) are not separators
        match = _GRES_ITEM.match(item.strip())
        if not match:
            return None
        if match.group("name") != "gpu":
            continue
        parts = (match.group("rest") or "").split(":") if match.group("rest") else []
        count = 1
        if parts and parts[-1].isdigit():
            count = int(parts[-1])
        elif len(parts) > 1:
            return None
        total += count
    return total


def slurm_gpu_count(gpus: List[Mapping[str, Any]]) -> Dict[str, Any]:
    """What Slurm counts as ``gres/gpu`` on a node: each GPU not in MIG mode once, and each MIG device
    of a GPU in MIG mode once (a GPU in MIG mode without MIG devices gives none).

    :param gpus: ``ansible_facts.nvidia.gpus`` of ``gpufleet.nvidia.gpu_facts`` (each ``index``,
        ``pci_bus_id``, ``mig.mode_current`` (bool or None), ``mig.devices`` ([{``profile``, ...}])).
    :returns: ``{"count": int, "whole_gpus": int, "mig_devices": int, "by_type": {type: int},
        "unknown": [bus ids of GPUs whose MIG mode was not read]}``; MIG devices are typed by their
        profile name, whole GPUs as ``gpu``.
    """
    whole, mig, by_type, unknown = 0, 0, {}, []  # type: int, int, Dict[str, int], List[str]
    for gpu in gpus or []:
        state = (gpu.get("mig") or {}) if isinstance(gpu, Mapping) else {}
        if state.get("mode_current") is True:
            for device in state.get("devices") or []:
                kind = str((device or {}).get("profile") or "mig")
                by_type[kind] = by_type.get(kind, 0) + 1
                mig += 1
            continue
        if state.get("mode_current") is None and state.get("devices"):
            unknown.append(str(gpu.get("pci_bus_id") or gpu.get("index")))
        whole += 1
        by_type["gpu"] = by_type.get("gpu", 0) + 1
    return {"count": whole + mig, "whole_gpus": whole, "mig_devices": mig, "by_type": by_type, "unknown": unknown}


def check_registration(show_node: str, node: str, gpus: List[Mapping[str, Any]],
                       registered: bool = False) -> Dict[str, Any]:
    """Whether Slurm may take the node back after a MIG layout change.

    :param show_node: ``scontrol show node -o NODE`` (read after the change; after slurmd's restart
        when ``registered``).
    :param node: the Slurm node name asked for (an answer for another node is refused).
    :param gpus: the node's GPU facts after the change (:func:`slurm_gpu_count`).
    :param registered: slurmd was restarted after the change and has registered since.
    :returns: ``{"found": int (gres/gpu the layout gives), "configured": int | None (slurm.conf's),
        "match": bool, "invalid": bool (INVALID_REG / INVAL or Slurm's own gpu-count drain),
        "ready": bool (may be resumed: counts match and, once registered, Slurm accepted it),
        "state", "reason", "drain_kind", "message": str}``.
    :raises ValueError: the answer is not ``scontrol show node`` of ``node``.
    """
    parsed = scheduler_state.parse_slurm_show_node(show_node, node)
    counted = slurm_gpu_count(gpus)
    configured = configured_gpus(parsed.get("gres"))
    match = configured is not None and configured == counted["count"]
    flags = set(parsed.get("flags") or []) | {parsed.get("state")}
    invalid = bool(flags & {"INVALID_REG", "INVAL"}) or parsed.get("drain_kind") == "gpu_count"
    ready = match and not (registered and invalid)
    layout = ", ".join("%s %d" % (k, v) for k, v in sorted(counted["by_type"].items()))
    if configured is None:
        message = ("Slurm's Gres=%s for node %s cannot be read as a gres/gpu count; the MIG layout gives %d (%s)"
                   % (parsed.get("gres"), node, counted["count"], layout))
    elif not match:
        message = ("the MIG layout gives node %s %d gres/gpu (%s) where slurm.conf configures Gres=gpu:%d; %s. Set the "
                   "node's Gres=gpu:%d in slurm.conf (and its gres.conf unless AutoDetect=nvml finds the MIG devices), "
                   "restart slurmctld (scontrol reconfigure does not change a GPU count) and run the policy again: "
                   "it resumes the node once Slurm has registered the new count"
                   % (node, counted["count"], layout, configured,
                      "Slurm would set the node INVAL and drain it" if counted["count"] < configured
                      else "Slurm would ignore the extra MIG devices", counted["count"]))
    elif registered and invalid:
        message = ("Slurm refused node %s's registration after the MIG change (state %s, reason %s) although slurm.conf "
                   "configures the %d gres/gpu the layout gives: check the node's own slurm.conf and gres.conf"
                   % (node, "+".join([parsed.get("state") or ""] + list(parsed.get("flags") or [])),
                      parsed.get("reason"), counted["count"]))
    else:
        message = "Slurm configures the %d gres/gpu the MIG layout of node %s gives (%s)" % (counted["count"], node, layout)
    return {"found": counted["count"], "configured": configured, "match": match, "invalid": invalid, "ready": ready,
            "state": "+".join([parsed.get("state") or ""] + list(parsed.get("flags") or [])),
            "reason": parsed.get("reason"), "drain_kind": parsed.get("drain_kind"), "by_type": counted["by_type"],
            "message": message}
