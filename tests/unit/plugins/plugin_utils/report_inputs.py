# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Realistic inputs for the report renderers: a drift report of a fleet, a rollout report directory.

:func:`drift_report` judges and rolls up a list of nodes as the drift_report action does.

The drift report is judged by the real drift engine from facts documents shaped as gpu_facts
returns them (facts_model), 8 GPUs a node with their real PCI bus ids; the rollout directory is
written by the real rollout_report / rollout_journal functions, as the rollout playbooks do.
"""

from __future__ import annotations

import copy

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.drift import DriftEngine, declared_state, judge_node, roll_up
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts, new_gpu
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_journal
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_report as rr


def drift_report(nodes, generated_at=None, source=None, keep_gpus="none", engine=None):
    """The drift report of ``nodes`` as the drift_report action makes it: drift.judge_node per node
    (``{"node", "class", "facts", "declared", ...}``, in this order), then drift.roll_up."""
    engine = engine or DriftEngine()
    nodes = list(nodes)
    facts = dict((item["node"], item.get("facts")) for item in nodes)
    return roll_up(((item["node"], judge_node(item, engine, keep_gpus)) for item in nodes),
                   generated_at=generated_at, source=source, keep_gpus=keep_gpus, facts_of=facts.get)


#: The PCI bus ids of an 8-GPU HGX H100 board, in NVML index order.
BUS_IDS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:4e:00.0",
           "0000:87:00.0", "0000:97:00.0", "0000:b8:00.0", "0000:cb:00.0")
LOST = "0000:4e:00.0"
XID79 = "[ 5123.4] NVRM: Xid (PCI:0000:4e:00): 79, pid=0, GPU has fallen off the bus.\n"

CLASSES = {
    "gpu_h100": ("NVIDIA H100 80GB HBM3", "Hopper", 700.0),
    "gpu_a100": ("NVIDIA A100-SXM4-80GB", "Ampere", 400.0),
    "gpu_l40s": ("NVIDIA L40S", "Ada Lovelace", 350.0),
}


def node_facts(klass, node_number, limit_w=None, lose_gpu=False):
    """A facts document of one node of ``klass``: R580 loaded, 8 GPUs, the class's power limit."""
    name, arch, default_w = CLASSES[klass]
    limit_w = default_w if limit_w is None else limit_w
    doc = new_facts("nvml")
    doc["driver"].update(userspace_version="580.126.20", loaded_version="580.126.20",
                         on_disk_version="580.126.20", branch="580", state="ok")
    for index, bus in enumerate(b for b in BUS_IDS if not (lose_gpu and b == LOST)):
        gpu = new_gpu(index)
        gpu.update(name=name, architecture=arch, uuid="GPU-%08x-%d" % (node_number, index), pci_bus_id=bus,
                   serial="1654%09d" % (node_number * 8 + index), persistence_mode=True, compute_mode="Default")
        gpu["power"].update(limit_w=limit_w, enforced_limit_w=limit_w, requested_limit_w=limit_w,
                            default_limit_w=default_w, min_limit_w=200.0, max_limit_w=default_w)
        gpu["ecc"].update(mode_current=True, mode_pending=True)
        doc["gpus"].append(gpu)
    doc["gpu_count"] = len(doc["gpus"])
    parsed = kernel_log.parse_kernel_log(XID79 if lose_gpu else "")
    doc["xid_events"] = parsed["events"]
    doc["xid_summary"] = kernel_log.summarize_xids(parsed)
    return doc


def declared(klass):
    """The declared state of a class: LTSB R580, the class's default power limit, persistence, 8 GPUs."""
    return declared_state({"driver_branch": "580", "gpu_policy_power_limit_w": CLASSES[klass][2],
                           "gpu_policy_persistence_mode": True, "gpufleet_gpu_count": 8})


def drift_fleet(nodes=100, hostile=None):
    """A drift report of ``nodes`` nodes over three classes (``keep_gpus="drifted"``, as the action keeps them).

    Every 60th node runs 50 W under its class's power limit on all 8 GPUs, every 97th lost GPU
    0000:4e:00.0 (7 GPUs and an Xid 79), every 500th has no facts. ``hostile`` (text) is used as
    the name, host name and power limit finding of one more drifted node.
    :returns: ``(report, expected counts {"drifted", "missing", "in_sync"})``.
    """
    names = sorted(CLASSES)
    decl = dict((klass, declared(klass)) for klass in names)
    healthy = dict((klass, node_facts(klass, 0)) for klass in names)
    items = []
    expected = {"drifted": 0, "missing": 0, "in_sync": 0}
    for number in range(1, nodes + 1):
        klass = names[number % len(names)]
        item = {"node": "gpu%05d" % number, "class": klass, "declared": decl[klass], "facts": healthy[klass]}
        if number % 500 == 0:
            item["facts"] = None
            expected["missing"] += 1
        elif number % 97 == 0:
            item["facts"] = node_facts(klass, number, lose_gpu=True)
        elif number % 60 == 0:
            item["facts"] = node_facts(klass, number, limit_w=CLASSES[klass][2] - 50)
        else:
            expected["in_sync"] += 1
            items.append(item)
            continue
        expected["drifted"] += 1
        items.append(item)
    if hostile is not None:
        facts = copy.deepcopy(healthy["gpu_h100"])
        for gpu in facts["gpus"]:
            gpu["power"]["enforced_limit_w"] = gpu["power"]["limit_w"] = 650.0
        items.append({"node": hostile, "class": "gpu_h100", "declared": decl["gpu_h100"], "facts": facts,
                      "hostname": hostile})
        expected["drifted"] += 1
    # As the drift_report action (judge_node per node, then roll_up), judging a healthy node of each
    # class once: an in-sync node's entry holds no node name, so the nodes of a class share one
    # judgement (copied for roll_up).
    engine = DriftEngine()
    shared = {}

    def judged(item):
        if item["facts"] is healthy.get(item["class"]):
            if item["class"] not in shared:
                shared[item["class"]] = judge_node(item, engine, "drifted")
            return dict(shared[item["class"]])
        return judge_node(item, engine, "drifted")
    facts = dict((item["node"], item["facts"]) for item in items)
    report = roll_up(((item["node"], judged(item)) for item in items), generated_at="2026-12-02T04:00:00Z",
                     source="jsonfile:/var/cache/facts", keep_gpus="drifted", facts_of=facts.get)
    report["source_errors"] = {}
    return report, expected


#: The demo's fleet: stage and class of each node.
ROLLOUT_NODES = (("node01", "golden", "gpu_h100"), ("node02", "canary", "gpu_a100"), ("node04", "canary", "gpu_v100"),
                 ("node03", "waves", "gpu_l40s"), ("node05", "waves", "gpu_h100"), ("node06", "waves", "gpu_a100"),
                 ("node07", "waves", "gpu_l40s"), ("node08", "waves", "gpu_h100"))

#: The golden node's contract change (contract_diff.contract_diff entries).
GOLDEN_DIFF = [
    {"scope": "node", "field": "driver_userspace_version", "label": "driver (userspace)", "unit": None,
     "before": "580.126.20", "after": "620.82.01", "kind": "changed"},
    {"scope": "node", "field": "cuda_driver_version", "label": "CUDA", "unit": None, "before": "13.0",
     "after": "13.2", "kind": "changed"},
    {"scope": "gpu", "field": "memory_reserved_mib", "label": "reserved memory", "unit": "MiB", "before": 545,
     "after": 612, "kind": "changed", "gpus": list(range(8)), "count": 8},
]


def rollout_dir(directory, reason="GPU count changed: 8 before, 7 after; Xid 79 on 0000:4e:00.0", last=None):
    """Write a rollout report directory as a stepped rollout of the demo's 8 nodes leaves it.

    node01 (golden) upgraded with a contract diff; canaries and waves upgraded in three more steps,
    except node06, rolled back to 580.126.20 with ``reason``; ``last``: the name of one more wave
    node, with ``reason`` as its reason too (for hostile text). Renders after every step.
    :returns: the last ``rollout_report.render`` result.
    """
    nodes = list(ROLLOUT_NODES) + ([(last, "waves", "gpu_h100")] if last else [])
    plan = {"rollout_id": "demo-ltsb", "started_at": "2026-12-02T03:00:00Z", "runs": ["ctl-1-1"],
            "stages": [{"name": stage, "hosts": [n for n, s, _c in nodes if s == stage]}
                       for stage in ("golden", "canary", "waves")],
            "nodes": [{"name": n, "stage": s, "class": c, "domain": None} for n, s, c in nodes],
            "options": {"max_unavailable": 1, "failure_budget": 1}}
    rr.write_plan(directory, plan)
    rr.render(directory, "2026-12-02T03:00:00Z")
    steps = [["node01"], ["node02", "node04"], ["node03", "node05", "node06"], ["node07", "node08"] + ([last] if last else [])]
    clock = 1796182000.0
    for step in steps:
        for name in step:
            rollout_journal.append(directory, {"event": "started", "node": name, "run_id": "ctl-1-1", "time": clock})
            clock += 5
        for name in step:
            stage, klass = [(s, c) for n, s, c in nodes if n == name][0]
            failed = name in ("node06", last)
            target = "580.126.20" if klass == "gpu_v100" else "620.82.01"
            record = {"node": name, "stage": stage, "class": klass, "rollout_id": "demo-ltsb", "run_id": "ctl-1-1",
                      "result": "rolled_back" if failed else "upgraded", "reason": reason if failed else "",
                      "before": {"loaded": "580.126.20"}, "after": {"loaded": "580.126.20" if failed else target},
                      "target": {"version": target}, "marks": {"started": clock - 240, "finished": clock},
                      "durations": {"total_s": 240.0}, "started_epoch": clock - 240, "finished_epoch": clock,
                      "rollback": {"version": "580.126.20", "ok": True} if failed else None}
            if name == "node01":
                record["contract_diff"] = GOLDEN_DIFF
            rr.store_record(directory, record)
            event = {"event": "finished", "node": name, "status": "failed" if failed else "done",
                     "result": record["result"], "changed": True, "run_id": "ctl-1-1", "time": clock,
                     "signature": "gpu_count" if failed else None, "implicates_driver": False}
            rollout_journal.append(directory, event)
            clock += 120
        done = rr.render(directory, "2026-12-02T04:00:00Z", step_end=True)
    return done
