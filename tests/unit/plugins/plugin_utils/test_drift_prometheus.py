# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift report's Prometheus textfile: promtool accepts it, its GPU series join dcgm-exporter's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.drift import declared_state, settle_gpus
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts, new_gpu
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift_output, drift_prometheus
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_budget
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_report as rr

from report_inputs import drift_report

BUS = ("0000:18:00.0", "0000:2a:00.0")
KERNEL_LOG = "[ 1234.5] NVRM: Xid (PCI:0000:2a:00): 79, pid=0, GPU has fallen off the bus.\n"


def node(limit_w=700.0, persistence=True, log=""):
    doc = new_facts("nvml")
    doc["driver"].update(userspace_version="580.95.05", loaded_version="580.95.05", on_disk_version="580.95.05",
                         branch="580", state="ok")
    for index, bus in enumerate(BUS):
        gpu = new_gpu(index)
        gpu.update(name="NVIDIA H100 80GB HBM3", architecture="Hopper", uuid="GPU-%s-%d" % (bus[5:7], index),
                   pci_bus_id=bus, serial="165000000%d" % index, persistence_mode=persistence, compute_mode="Default")
        gpu["power"].update(limit_w=limit_w, enforced_limit_w=limit_w, requested_limit_w=limit_w, default_limit_w=700.0,
                            min_limit_w=200.0, max_limit_w=700.0)
        gpu["ecc"].update(mode_current=True, mode_pending=True)
        gpu["remapped_rows"].update(correctable=1, uncorrectable=0, pending=False, failed=False)
        doc["gpus"].append(gpu)
    doc["gpu_count"] = len(BUS)
    parsed = kernel_log.parse_kernel_log(log)
    doc["xid_events"] = parsed["events"]
    doc["xid_summary"] = kernel_log.summarize_xids(parsed)
    return doc


DECLARED = declared_state({"driver_branch": "580", "gpu_policy_power_limit_w": 700, "gpu_policy_persistence_mode": True,
                           "gpufleet_gpu_count": 2})


def fleet_report(keep_gpus="drifted"):
    nodes = [
        {"node": "ok1", "class": "gpu_h100", "facts": node(), "declared": DECLARED},
        {"node": "low", "class": "gpu_h100", "facts": node(limit_w=650.0), "declared": DECLARED, "hostname": "low.node"},
        {"node": "xid", "class": "gpu_h100", "facts": node(log=KERNEL_LOG), "declared": DECLARED},
        {"node": "gone", "class": "gpu_h100", "facts": None, "declared": DECLARED},
    ]
    return drift_report(nodes, generated_at="2026-12-01T00:00:00Z", source="test", keep_gpus=keep_gpus)


def rollout():
    plan = {"rollout_id": "driver-r580", "stages": [{"name": "golden", "hosts": ["h1"]},
                                                    {"name": "waves", "hosts": ["h2", "h3"]}]}
    records = {
        "h1": {"node": "h1", "stage": "golden", "class": "gpu_h100", "result": "upgraded"},
        "h2": {"node": "h2", "stage": "waves", "class": "gpu_h100", "result": "rolled_back",
               "reason": "GPU count changed: 2 before, 1 after"},
    }
    nodes = [{"name": "h1", "class": "gpu_h100", "stage": "golden", "status": "done"},
             {"name": "h2", "class": "gpu_h100", "stage": "waves", "status": "failed", "signature": "gpu_count"},
             {"name": "h3", "class": "gpu_h100", "stage": "waves", "status": "pending"}]
    decision = rollout_budget.decide(nodes, rollout_budget.normalize_options({}))
    return rr.build_report(plan, records, "2026-12-01T00:00:00Z", decision)


def samples(text):
    """``{(metric, frozenset(labels)): value}`` of an exposition text, as Prometheus parses it."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def write(tmp_path, report, rollout_report=None):
    path = tmp_path / "gpufleet_drift.prom"
    drift_prometheus.write_textfile(str(path), report, 1796000000.0, rollout_report)
    return path.read_text()


def test_dcgm_bus_id_is_nvml_bus_id():
    assert drift_prometheus.dcgm_bus_id("0000:3b:00.0") == "00000000:3B:00.0"
    assert drift_prometheus.dcgm_bus_id("00000000:9A:00.0") == "00000000:9A:00.0"
    assert drift_prometheus.dcgm_bus_id(None) == ""
    assert drift_prometheus.dcgm_bus_id("not a bus") == "not a bus"


def test_drifted_gpus_join_dcgm_exporter_series_on_hostname_and_uuid(tmp_path):
    text = write(tmp_path, fleet_report())
    ours = samples(text)
    # A dcgm-exporter scrape of node "low.node", shaped as dcgm-exporter writes it.
    dcgm = samples(
        '# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-18-0",pci_bus_id="00000000:18:00.0",device="nvidia0",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="low.node",DCGM_FI_DRIVER_VERSION="580.95.05"} 612.5\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-2a-1",pci_bus_id="00000000:2A:00.0",device="nvidia1",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="low.node",DCGM_FI_DRIVER_VERSION="580.95.05"} 598.0\n')
    # The PromQL join `gpufleet_gpu_power_limit_watts{limit="enforced"} * on(Hostname, UUID) group_left
    # DCGM_FI_DEV_POWER_USAGE`, done by hand: match on the two labels, keep both values.
    joined = {}
    for (name, labels), value in ours.items():
        labels = dict(labels)
        if name != "gpufleet_gpu_power_limit_watts" or labels["limit"] != "enforced":
            continue
        for (dcgm_name, dcgm_labels), usage in dcgm.items():
            dcgm_labels = dict(dcgm_labels)
            if (dcgm_labels["Hostname"], dcgm_labels["UUID"]) == (labels["Hostname"], labels["UUID"]):
                joined[(labels["Hostname"], labels["UUID"])] = (value, usage)
                # The other identifying labels agree too, in dcgm-exporter's format.
                for key in ("gpu", "pci_bus_id", "modelName"):
                    assert labels[key] == dcgm_labels[key], key
    assert joined == {("low.node", "GPU-18-0"): (650.0, 612.5), ("low.node", "GPU-2a-1"): (650.0, 598.0)}


def test_per_gpu_series_hold_power_remapped_rows_xids_and_policy(tmp_path):
    ours = samples(write(tmp_path, fleet_report()))

    def gpu(host, uuid, index, bus, **extra):
        labels = {"Hostname": host, "UUID": uuid, "gpu": str(index), "pci_bus_id": bus,
                  "modelName": "NVIDIA H100 80GB HBM3"}
        labels.update(extra)
        return frozenset(labels.items())
    low0 = ("low.node", "GPU-18-0", 0, "00000000:18:00.0")
    assert ours[("gpufleet_gpu_power_limit_watts", gpu(*low0, limit="default"))] == 700.0
    assert ours[("gpufleet_gpu_power_limit_watts", gpu(*low0, limit="enforced"))] == 650.0
    assert ours[("gpufleet_gpu_drift_findings", gpu(*low0, severity="warning"))] == 1.0
    assert ours[("gpufleet_gpu_persistence_mode", gpu(*low0))] == 1.0
    assert ours[("gpufleet_gpu_remapped_rows", gpu(*low0, cause="correctable"))] == 1.0
    assert ours[("gpufleet_gpu_remapped_rows_pending", gpu(*low0))] == 0.0
    # Xid 79 names 0000:2a:00 on node "xid": that GPU counts it, its neighbour does not.
    assert ours[("gpufleet_gpu_fatal_xid_events", gpu("xid", "GPU-2a-1", 1, "00000000:2A:00.0"))] == 1.0
    assert ours[("gpufleet_gpu_fatal_xid_events", gpu("xid", "GPU-18-0", 0, "00000000:18:00.0"))] == 0.0
    info = [dict(labels) for (name, labels) in ours if name == "gpufleet_gpu_info"]
    assert {(i["Hostname"], i["driver_version"], i["driver_state"], i["class"]) for i in info} == {
        ("low.node", "580.95.05", "ok", "gpu_h100"), ("xid", "580.95.05", "ok", "gpu_h100")}
    # In-sync ok1 has node series but no GPU series under the default (drifted nodes only).
    assert ours[("gpufleet_drift_node_in_sync", frozenset({"Hostname": "ok1", "node": "ok1", "class": "gpu_h100"}.items()))] == 1.0
    assert not [labels for (name, labels) in ours if name.startswith("gpufleet_gpu_") and ("Hostname", "ok1") in labels]
    assert ours[("gpufleet_drift_nodes", frozenset({"status": "missing"}.items()))] == 1.0
    assert ours[("gpufleet_drift_class_nodes", frozenset({"class": "gpu_h100", "status": "drifted"}.items()))] == 3.0
    everything = samples(write(tmp_path, fleet_report(keep_gpus="all")))
    assert ("gpufleet_gpu_persistence_mode", gpu("ok1", "GPU-18-0", 0, "00000000:18:00.0")) in everything


def test_a_node_drifted_only_by_driver_version_skew_keeps_its_gpus_in_the_json_and_the_series(tmp_path):
    # Its own checks find "odd" in sync; the class-level pass drifts it (two versions in gpu_h100, one node each:
    # the newest wins), after judge_node decided the GPU summaries. The default prometheus_gpus=drifted keeps them.
    odd = node()
    odd["driver"].update(userspace_version="580.82.07", loaded_version="580.82.07", on_disk_version="580.82.07")
    nodes = [{"node": "ok1", "class": "gpu_h100", "facts": node(), "declared": DECLARED},
             {"node": "odd", "class": "gpu_h100", "facts": odd, "declared": DECLARED, "hostname": "odd.node"}]
    report = drift_report(nodes, generated_at="2026-12-01T00:00:00Z", source="test", keep_gpus="drifted")
    entry = json.loads(drift_output.render_json(report))["nodes"]["odd"]
    assert [f["check"] for f in entry["findings"]] == ["driver_version_skew"] and entry["in_sync"] is False
    assert len(entry["gpus"]) == 2 and [gpu["pci_bus_id"] for gpu in entry["gpus"]] == list(BUS)
    assert [gpu["findings"] for gpu in entry["gpus"]] == [0, 0]
    assert "gpus" not in json.loads(drift_output.render_json(report))["nodes"]["ok1"]
    ours = samples(write(tmp_path, report))
    odd_gpus = sorted((name, dict(labels)["pci_bus_id"]) for (name, labels) in ours
                      if name == "gpufleet_gpu_info" and dict(labels)["Hostname"] == "odd.node")
    assert odd_gpus == [("gpufleet_gpu_info", "00000000:18:00.0"), ("gpufleet_gpu_info", "00000000:2A:00.0")]
    labels = frozenset({"Hostname": "odd.node", "UUID": "GPU-18-0", "gpu": "0", "pci_bus_id": "00000000:18:00.0",
                        "modelName": "NVIDIA H100 80GB HBM3", "limit": "enforced"}.items())
    assert ours[("gpufleet_gpu_power_limit_watts", labels)] == 700.0
    assert not [labels for (name, labels) in ours if name.startswith("gpufleet_gpu_") and ("Hostname", "ok1") in labels]
    # The same series as with prometheus_gpus=all, which kept every node's GPUs from the start.
    everything = samples(write(tmp_path, drift_report(nodes, source="test", keep_gpus="all")))
    assert sorted(k for k in ours if ("Hostname", "odd.node") in k[1] and k[0].startswith("gpufleet_gpu_")) == sorted(
        k for k in everything if ("Hostname", "odd.node") in k[1] and k[0].startswith("gpufleet_gpu_"))


def test_gpu_summaries_are_settled_after_every_finding():
    judged = [("a", {"in_sync": False, "missing": False, "findings": []}),
              ("b", {"in_sync": True, "missing": False, "findings": [], "gpus": [{"index": 0}]}),
              ("c", {"in_sync": False, "missing": True, "findings": []})]
    asked = []

    def facts_of(name):
        asked.append(name)
        return node()
    assert settle_gpus(judged, "drifted", facts_of) == 1
    assert asked == ["a"] and len(judged[0][1]["gpus"]) == 2
    assert "gpus" not in judged[1][1] and "gpus" not in judged[2][1]
    settle_gpus(judged, "none")
    assert not [entry for _name, entry in judged if "gpus" in entry]
    settle_gpus(judged, "all", lambda name: "not a document")
    assert [entry.get("gpus") for _name, entry in judged] == [[], [], None]
    with pytest.raises(ValueError, match="keep_gpus must be one of none, drifted, all"):
        settle_gpus(judged, "some")


def test_rollout_metrics_from_a_rollout_report(tmp_path):
    ours = samples(write(tmp_path, fleet_report(keep_gpus="none"), rollout()))

    def labels(**items):
        return frozenset(dict(items, rollout_id="driver-r580").items())
    assert ours[("gpufleet_rollout_nodes", labels(**{"class": "gpu_h100", "result": "rolled_back"}))] == 1.0
    assert ours[("gpufleet_rollout_nodes", labels(**{"class": "gpu_h100", "result": "upgraded"}))] == 1.0
    assert ours[("gpufleet_rollout_stage_nodes", labels(stage="waves", result="not_started"))] == 1.0
    # 3 nodes: 10 % unavailable and 1 % failures round up to one node each; h2 failed and is out of service.
    assert ours[("gpufleet_rollout_capacity_free_nodes", labels(**{"class": "gpu_h100"}))] == 0.0
    assert ours[("gpufleet_rollout_out_of_service_nodes", labels(**{"class": "gpu_h100"}))] == 1.0
    assert ours[("gpufleet_rollout_failure_budget_left_nodes", labels(**{"class": "gpu_h100"}))] == 0.0
    status = [dict(l) for (name, l) in ours if name == "gpufleet_rollout_info"]
    assert len(status) == 1 and status[0]["status"] == rollout()["status"]
    assert ours[("gpufleet_rollout_stopped", labels())] == (1.0 if rollout()["status"] == "stopped" else 0.0)


def promtool():
    found = shutil.which("promtool")
    if found is None and os.environ.get("CI"):
        pytest.fail("promtool is missing: Debian's prometheus package ships it (make host-packages installs it)")
    if found is None:
        pytest.skip("promtool is not installed here (apt-get install prometheus); CI runs this test")
    return found


def test_promtool_accepts_the_textfile(tmp_path):
    tool = promtool()
    text = write(tmp_path, fleet_report(keep_gpus="all"), rollout())
    proc = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    # Exit 3 is "lint problems only". The one lint promtool has is the camelCase of the labels
    # dcgm-exporter names (Hostname, UUID, modelName), kept so the series join; nothing else.
    gpu_families = set(line.split(" ", 1)[0] for line in problems)
    assert proc.returncode in (0, 3), problems
    assert all(line.endswith("label names should be written in 'snake_case' not 'camelCase'") for line in problems), problems
    assert gpu_families <= {name for name in samples_names(text) if name.startswith("gpufleet_gpu_")
                            or name.startswith("gpufleet_drift_node_") or name == "gpufleet_driver_info"}
    broken = text.replace("gpufleet_drift_nodes{status=\"all\"} 4.0", "gpufleet_drift_nodes{status=\"all\"} four")
    assert subprocess.run([tool, "check", "metrics"], input=broken, capture_output=True, text=True,
                          check=False).returncode == 1


def samples_names(text):
    return set(family.name for family in text_string_to_metric_families(text))
