# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift engine, its fact sources (directory, jsonfile cache of ansible-core 2.19 and older, AWX)
and its outputs (JSON, Markdown, Prometheus)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.drift import (
    CHECKS,
    DriftEngine,
    declared_state,
    exit_code,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts, new_gpu
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_xml import parse_nvidia_smi_xml
from ansible_collections.gpufleet.nvidia.plugins.module_utils.rollout_marks import rollout_marks
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift_output, fact_sources

from report_inputs import drift_report

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "cases")

PROFILES = {
    "h100": ("NVIDIA H100 80GB HBM3", "Hopper", 8, 700.0),
    "v100": ("Tesla V100-SXM2-32GB", "Volta", 8, 300.0),
    "l40s": ("NVIDIA L40S", "Ada Lovelace", 4, 350.0),
}


def node_facts(profile="h100", version="620.70.06", limit_w=None, persistence=True, ecc=True, held=True,
               kernel_log_text=""):
    name, arch, count, default_w = PROFILES[profile]
    doc = new_facts("nvml")
    doc["driver"].update(userspace_version=version, loaded_version=version, on_disk_version=version,
                         branch=version.split(".")[0], state="ok", kernel_module_type="open",
                         package_manager="dpkg",
                         packages=[{"name": "nvidia-driver", "version": version + "-1", "held": held},
                                   {"name": "libnvidia-ml1", "version": version + "-1", "held": True}])
    for index in range(count):
        gpu = new_gpu(index)
        gpu.update(name=name, architecture=arch, uuid="GPU-%s-%d" % (profile, index),
                   pci_bus_id="0000:%02x:00.0" % (0x18 + index), persistence_mode=persistence,
                   compute_mode="Default")
        gpu["power"].update(limit_w=limit_w or default_w, enforced_limit_w=limit_w or default_w,
                            requested_limit_w=limit_w or default_w, default_limit_w=default_w,
                            min_limit_w=100.0, max_limit_w=default_w)
        gpu["ecc"].update(mode_current=ecc, mode_pending=ecc)
        gpu["mig"].update(mode_current=False, mode_pending=False)
        doc["gpus"].append(gpu)
    doc["gpu_count"] = count
    parsed = kernel_log.parse_kernel_log(kernel_log_text)
    doc["xid_events"] = parsed["events"]
    doc["xid_summary"] = kernel_log.summarize_xids(parsed)
    return doc


H100_VARS = {"driver_branch": "ltsb", "gpu_policy_power_limit_w": 600, "gpu_policy_persistence_mode": True,
             "gpu_policy_ecc_mode": True, "gpufleet_gpu_count": 8}
V100_VARS = {"driver_branch": "ltsb", "gpu_policy_persistence_mode": True, "gpufleet_gpu_count": 8}


def checks(findings):
    return sorted(set(f["check"] for f in findings))


def test_declared_state_reads_role_variables():
    declared = declared_state(dict(H100_VARS, driver_version="", gpu_policy_compute_mode="exclusive_process",
                                   driver_kernel_module_type="auto"))
    assert declared["driver"] == {"branch": "ltsb", "version": None, "kernel_module_type": None,
                                  "allow_eol": False, "architectures": []}
    assert declared["policy"]["power_limit_w"] == 600
    assert declared["policy"]["compute_mode"] == "exclusive_process"
    assert declared["gpu_count"] == 8
    assert declared["mig"] is None
    assert declared_state({})["policy"] is None


def test_ltsb_resolves_per_architecture():
    engine = DriftEngine()
    # H100 on R620 and V100 on R580 both match "ltsb"; H100 on R580 does not.
    h100_ok = node_facts("h100", limit_w=600.0)
    assert engine.node_findings("h1", "gpu_h100", h100_ok, declared_state(H100_VARS)) == []
    assert engine.node_findings("v1", "gpu_v100", node_facts("v100", version="580.95.05"),
                                declared_state(V100_VARS)) == []
    old = engine.node_findings("h2", "gpu_h100", node_facts("h100", version="580.95.05", limit_w=600.0),
                               declared_state(H100_VARS))
    assert checks(old) == ["driver_branch"]
    assert old[0]["severity"] == "critical"
    assert old[0]["expected"] == "620" and old[0]["actual"] == "580"
    assert old[0]["message"] == "driver branch R580, declared R620 (ltsb resolves to R620 for Hopper)"


def test_declared_exact_version_and_invalid_branch():
    engine = DriftEngine()
    found = engine.node_findings("h1", "gpu_h100", node_facts("h100", version="620.70.06", limit_w=600.0),
                                 declared_state(dict(H100_VARS, driver_version="620.48.02", driver_branch="620")))
    assert checks(found) == ["driver_version"]
    assert found[0]["severity"] == "warning"
    assert found[0]["message"] == "driver 620.70.06, declared 620.48.02"
    # R620 on a V100 node: the declaration itself is wrong, naming the last branch for Volta.
    bad = engine.node_findings("v1", "gpu_v100", node_facts("v100", version="580.95.05"),
                               declared_state(dict(V100_VARS, driver_branch="620")))
    assert "driver_declared_invalid" in checks(bad)
    message = [f for f in bad if f["check"] == "driver_declared_invalid"][0]["message"]
    assert "Volta" in message and "580" in message


def test_policy_drift_per_gpu_with_real_values():
    engine = DriftEngine()
    facts = node_facts("h100", limit_w=700.0, persistence=False, ecc=False)
    facts["gpus"][0]["ecc"]["mode_pending"] = True
    found = engine.node_findings("h1", "gpu_h100", facts, declared_state(H100_VARS))
    power = [f for f in found if f["check"] == "power_limit_w"]
    assert len(power) == 8
    assert power[0]["expected"] == 600.0 and power[0]["actual"] == 700.0
    assert power[0]["message"] == "GPU 0: power_limit_w is 700 W, declared 600 W"
    assert len([f for f in found if f["check"] == "persistence_mode"]) == 8
    # GPU 0 has ECC pending as declared: info, not drift; the other 7 drift.
    assert [f["gpu"] for f in found if f["check"] == "ecc_mode_pending"] == [0]
    assert [f["gpu"] for f in found if f["check"] == "ecc_mode"] == list(range(1, 8))
    percent = engine.node_findings("h1", "gpu_h100", node_facts("h100", limit_w=595.0),
                                   declared_state({"gpu_policy_power_limit_percent": 85}))
    assert percent == []


def test_health_findings_gpu_count_unreadable_fatal_xid_unpinned():
    engine = DriftEngine()
    facts = node_facts("h100", limit_w=600.0, held=False,
                       kernel_log_text="[ 99.1] NVRM: Xid (PCI:0000:1a:00): 79, pid=0, GPU has fallen off the bus.\n")
    facts["gpus"] = facts["gpus"][:7]
    facts["gpu_count"] = 7
    facts["gpus"][2].update(readable=False, errors=["GpuIsLost"])
    found = engine.node_findings("h1", "gpu_h100", facts, declared_state(H100_VARS))
    assert checks(found) == ["driver_not_pinned", "fatal_xid", "gpu_count", "gpu_unreadable"]
    by = dict((f["check"], f) for f in found)
    assert by["gpu_count"]["message"] == "7 GPU(s) visible, 8 declared"
    assert by["fatal_xid"]["actual"] == [79]
    assert by["driver_not_pinned"]["actual"] == ["nvidia-driver"]


def test_a_node_a_rollout_flagged_is_a_finding_with_the_flag_reason():
    """The demo's node06: flagged after its rollback reboot, one GPU lost (7 of 8 declared)."""
    engine = DriftEngine()
    facts = node_facts("h100", version="580.126.20", limit_w=600.0)
    facts["gpus"] = facts["gpus"][:7]
    facts["gpu_count"] = 7
    flag = {"flagged": True, "rollout_id": "driver-ltsb", "stage": "canary", "time": "2026-11-29T21:55:41Z",
            "reason": "GPU count changed: 8 before, 7 after", "rollback_version": "580.126.20", "drained": True}
    drain = {"backend": "slurm", "rollout_id": "driver-ltsb", "drained_at": "2026-11-29T21:40:02Z"}
    facts["rollout"] = rollout_marks({"exists": True, "content": flag, "unreadable": None},
                                     {"exists": True, "content": drain, "unreadable": None})
    found = engine.node_findings("node06", "gpu_h100", facts, declared_state(dict(H100_VARS, driver_branch="580")))
    by = dict((f["check"], f) for f in found)
    assert sorted(by) == ["gpu_count", "rollout_flagged"]
    assert by["rollout_flagged"]["severity"] == "critical"
    assert by["rollout_flagged"]["message"] == ("flagged by rollout driver-ltsb (stage canary, 2026-11-29T21:55:41Z): "
                                                "GPU count changed: 8 before, 7 after")
    assert by["gpu_count"]["message"] == "7 GPU(s) visible, 8 declared"
    # Drained by a rollout without a flag: in flight, or left out of service.
    facts["rollout"] = rollout_marks({"exists": False, "content": None, "unreadable": None},
                                     {"exists": True, "content": drain, "unreadable": None})
    found = engine.node_findings("node06", "gpu_h100", facts, declared_state(dict(H100_VARS, driver_branch="580")))
    drained = [f for f in found if f["check"].startswith("rollout_")]
    assert [(f["check"], f["severity"], f["message"]) for f in drained] == [
        ("rollout_drained", "warning", "drained by rollout driver-ltsb since 2026-11-29T21:40:02Z and not returned to "
                                       "service")]
    # A flag file that cannot be parsed is a flag too (the rollout refuses such a node).
    marks = rollout_marks({"exists": True, "content": None, "unreadable": "/etc/x.fact is not JSON (Expecting value)"}, None)
    assert marks["flagged"] is True and marks["drained"] is None
    assert marks["reason"] == "/etc/x.fact is not JSON (Expecting value); inspect and remove it"
    # Not read at all (a capture bundle): unknown, and no finding.
    assert rollout_marks(None, None)["flagged"] is None
    # The node's own headline rides along with its findings in the report.
    facts["headline"] = {"verdict": "unhealthy", "summary": "unhealthy: flagged", "action": "clear_rollout_flag",
                         "next_step": "run playbooks/rollback.yml", "gpus": []}
    report = drift_report([{"node": "node06", "class": "gpu_h100", "facts": facts,
                            "declared": declared_state(dict(H100_VARS, driver_branch="580"))}])
    assert report["nodes"]["node06"]["headline"] == {"verdict": "unhealthy", "summary": "unhealthy: flagged",
                                                     "action": "clear_rollout_flag",
                                                     "next_step": "run playbooks/rollback.yml"}


def test_case_01_a100_mig_persistence_and_count():
    with open(os.path.join(CASES, "01-a100-sxm4-mig-xml-v12", "input.xml"), encoding="utf-8") as handle:
        parsed = parse_nvidia_smi_xml(handle.read())
    facts = new_facts("nvidia-smi")
    facts["driver"].update(parsed["driver"], loaded_version="535.54.03", on_disk_version="535.54.03", state="ok")
    facts["gpus"] = parsed["gpus"]
    facts["gpu_count"] = len(parsed["gpus"])
    facts["attached_gpus"] = parsed["attached_gpus"]
    declared = declared_state({
        "driver_version": "535.54.03", "driver_branch": "535", "driver_allow_eol": True,
        "gpu_policy_persistence_mode": True, "gpu_policy_ecc_mode": True, "gpufleet_gpu_count": 4,
        "gpu_policy_mig_layout": [{"devices": "all", "mig-enabled": True, "mig-devices": {"2g.20gb": 3}}],
    })
    found = DriftEngine().node_findings("a1", "gpu_a100", facts, declared)
    by = dict((f["check"], f) for f in found)
    # Persistence Disabled is drift; ECC Enabled and not pending is in sync; 1 GPU listed of 4 attached.
    assert sorted(by) == ["gpu_count", "mig_layout", "persistence_mode"]
    assert by["persistence_mode"]["actual"] is False
    assert by["gpu_count"]["actual"] == 1 and by["gpu_count"]["expected"] == 4
    # DTD v12 names no MIG profile: 4 instances counted as "unknown", never matching a declared layout.
    assert by["mig_layout"]["actual"] == {"unknown": 4}
    assert by["mig_layout"]["expected"] == {"2g.20gb": 3}


def test_missing_facts_and_stale_facts():
    engine = DriftEngine(max_age_s=3600)
    assert checks(engine.node_findings("x", "gpu_h100", None, declared_state(H100_VARS))) == ["facts_missing"]
    stale = engine.node_findings("x", "gpu_h100", node_facts(limit_w=600.0), declared_state(H100_VARS),
                                 facts_age_s=7200.0)
    assert checks(stale) == ["facts_stale"]


def _fleet():
    return [
        {"node": "h1", "class": "gpu_h100", "facts": node_facts("h100", limit_w=600.0),
         "declared": declared_state(H100_VARS)},
        {"node": "h2", "class": "gpu_h100", "facts": node_facts("h100", version="580.95.05", limit_w=600.0),
         "declared": declared_state(H100_VARS)},
        {"node": "h3", "class": "gpu_h100", "facts": None, "declared": declared_state(H100_VARS)},
        {"node": "v1", "class": "gpu_v100", "facts": node_facts("v100", version="580.95.05"),
         "declared": declared_state(V100_VARS)},
    ]


def test_report_per_node_and_per_class():
    report = drift_report(_fleet(), generated_at="2026-11-29T12:00:00Z", source="dir:facts")
    summary = report["summary"]
    assert (summary["nodes"], summary["in_sync"], summary["drifted"], summary["missing"]) == (4, 2, 2, 1)
    assert summary["by_severity"] == {"info": 0, "warning": 1, "critical": 2}
    # h1 runs 620.70.06, h2 580.95.05: two versions in one class, h2 the odd one out (a tie: the newest wins).
    assert summary["by_check"] == {"driver_branch": 1, "facts_missing": 1, "driver_version_skew": 1}
    assert report["classes"]["gpu_h100"]["driver_versions"] == {"580.95.05": 1, "620.70.06": 1}
    assert report["classes"]["gpu_h100"]["drifted_nodes"] == ["h2", "h3"]
    assert report["classes"]["gpu_v100"]["in_sync"] == 1
    assert report["nodes"]["v1"]["driver"] == {"loaded": "580.95.05", "userspace": "580.95.05", "on_disk": "580.95.05",
                                               "branch": "580", "state": "ok"}
    assert "gpus" not in report["nodes"]["v1"]
    assert exit_code(report) == 2
    assert exit_code(report, report_only=True) == 0
    assert exit_code(drift_report(_fleet()[:1])) == 0
    with pytest.raises(ValueError):
        exit_code(report, fail_on="fatal")


def test_case42_two_driver_versions_in_one_class_are_reported_undeclared():
    # nccl-tests issue 297: node1 on 550.144.03 and node2 on 570.124.06 in one job; nothing declares a version.
    undeclared = declared_state({"gpufleet_gpu_count": 8})
    nodes = [{"node": "node%d" % i, "class": "gpu_h100", "facts": node_facts("h100", version=version),
              "declared": undeclared}
             for i, version in enumerate(["570.124.06", "570.124.06", "550.144.03"], start=1)]
    report = drift_report(nodes)
    skew = [f for f in report["findings"] if f["check"] == "driver_version_skew"]
    assert [(f["node"], f["actual"], f["expected"], f["severity"]) for f in skew] == [
        ("node3", "550.144.03", "570.124.06", "warning")]
    assert "class gpu_h100 runs 2 driver versions (550.144.03 x1, 570.124.06 x2)" in skew[0]["message"]
    assert report["classes"]["gpu_h100"]["drifted_nodes"] == ["node3"]
    assert report["classes"]["gpu_h100"]["driver_versions"] == {"550.144.03": 1, "570.124.06": 2}
    one_version = drift_report(nodes[:2])
    assert one_version["summary"]["by_check"] == {} and one_version["summary"]["drifted"] == 0


def test_every_check_has_a_known_severity():
    assert set(sev for sev, _text in CHECKS.values()) <= {"info", "warning", "critical"}


def test_outputs_markdown_json():
    report = drift_report(_fleet(), generated_at="2026-11-29T12:00:00Z", source="dir:facts")
    markdown = drift_output.render_markdown(report)
    assert "**4 nodes: 2 in sync, 2 drifted (1 without facts).**" in markdown
    assert "| gpu_h100 | 3 | 1 | 2 | 1 | critical | driver_branch 1, driver_version_skew 1, facts_missing 1 |" in markdown
    assert ("| h2 | gpu_h100 | critical | driver_branch | - | driver branch R580, declared R620 "
            "(ltsb resolves to R620 for Hopper) |") in markdown
    limited = drift_output.render_markdown(report, max_findings=1)
    assert "… and 2 more findings" in limited
    assert json.loads(drift_output.render_json(report))["summary"]["drifted"] == 2


def test_markdown_escapes_table_cells():
    fleet = [{"node": "a|b", "class": "gpu_h100", "facts": None, "declared": {}}]
    assert "| a\\|b |" in drift_output.render_markdown(drift_report(fleet))


# --- fact sources ----------------------------------------------------------------------------


def read_fact_files(path, source="dir", prefix="", hosts=None, now=None):
    """Locate and load every fact file of a source, as the drift_report action reads them one by one."""
    return dict((host, fact_sources.load_fact_file(file_path, now=now))
                for host, file_path in fact_sources.locate_fact_files(path, source, prefix, hosts).items())


def test_read_fact_dir_reads_documents_and_wrapped_facts(tmp_path):
    doc = node_facts("h100")
    (tmp_path / "h1.json").write_text(json.dumps(doc))
    (tmp_path / "h2.json").write_text(json.dumps({"ansible_facts": {"nvidia": doc}}))
    (tmp_path / "h3.json").write_text("{not json")
    (tmp_path / "h4.json").write_text(json.dumps({"other": 1}))
    found = read_fact_files(str(tmp_path), now=os.path.getmtime(str(tmp_path / "h1.json")) + 10)
    assert sorted(found) == ["h1", "h2", "h3", "h4"]
    assert found["h1"]["facts"]["driver"]["loaded_version"] == "620.70.06"
    assert found["h2"]["facts"]["gpu_count"] == 8
    assert found["h3"]["facts"] is None and found["h3"]["error"].startswith("not JSON")
    assert found["h4"]["error"] == "no nvidia facts in the file"
    assert 9.0 <= found["h1"]["age_s"] <= 11.0
    assert sorted(read_fact_files(str(tmp_path), hosts=["h1", "nope"])) == ["h1"]
    with pytest.raises(fact_sources.FactSourceError):
        read_fact_files(str(tmp_path / "nope"))


def test_tagged_payload_values_are_unwrapped():
    inner = {"nvidia": {"value": {"driver": {"value": {"state": {"value": "ok", "tags": [
        {"path": "play.yml", "line_num": 6, "col_num": 34, "__ansible_type": "Origin"},
        {"__ansible_type": "TrustedAsTemplate"}], "__ansible_type": "_AnsibleTaggedStr"}},
        "tags": [], "__ansible_type": "_AnsibleTaggedDict"}, "schema_version": 1},
        "tags": [], "__ansible_type": "_AnsibleTaggedDict"}}
    facts, wrapped = fact_sources.decode_cache_text(json.dumps({"__payload__": json.dumps(inner)}))
    assert wrapped is True
    assert facts == {"nvidia": {"driver": {"state": "ok"}, "schema_version": 1}}
    plain, wrapped = fact_sources.decode_cache_text(json.dumps({"ansible_nvidia": {"driver": {}}}))
    assert wrapped is False and plain == {"ansible_nvidia": {"driver": {}}}


def test_old_style_and_awx_cache_files(tmp_path):
    doc = node_facts("v100", version="580.95.05")
    (tmp_path / "gpf_v1").write_text(json.dumps({"ansible_nvidia": doc, "ansible_hostname": "v1"}))
    (tmp_path / "gpf_s1_h1").write_text(json.dumps({"__payload__": json.dumps({"nvidia": node_facts("h100")})}))
    (tmp_path / "gpf_h1").write_text(json.dumps({"nvidia": node_facts("h100", version="580.95.05")}))
    (tmp_path / "other_x").write_text("{}")
    found = read_fact_files(str(tmp_path), "jsonfile", prefix="gpf_")
    assert sorted(found) == ["h1", "v1"]
    # The ansible-core 2.19 file (s1_) wins over an old-style file of the same host.
    assert found["h1"]["facts"]["driver"]["loaded_version"] == "620.70.06"
    assert found["v1"]["facts"]["driver"]["loaded_version"] == "580.95.05"
    files = fact_sources.locate_fact_files(str(tmp_path), "jsonfile", "gpf_")
    assert files == {"h1": str(tmp_path / "gpf_s1_h1"), "v1": str(tmp_path / "gpf_v1")}
    assert fact_sources.load_fact_file(files["v1"])["wrapped"] is False
    with pytest.raises(fact_sources.FactSourceError):
        fact_sources.locate_fact_files(str(tmp_path), "redis")
    only = read_fact_files(str(tmp_path), "jsonfile", prefix="gpf_", hosts=["h1", "v1", "zz"])
    assert sorted(only) == ["h1", "v1"]
    assert only["h1"]["wrapped"] is True


def test_real_ansible_core_jsonfile_cache(tmp_path):
    """ansible-core itself writes the cache; the reader finds the facts it wrote."""
    doc = node_facts("l40s", version="595.91.07")
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    playbook = tmp_path / "cache.yml"
    playbook.write_text(
        "- name: Cache NVIDIA facts\n"
        "  hosts: node-a\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Set cacheable facts from a file\n"
        "      ansible.builtin.set_fact:\n"
        "        cacheable: true\n"
        "        nvidia: \"{{ lookup('ansible.builtin.file', 'doc.json') | from_json }}\"\n"
    )
    cache = tmp_path / "cache"
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN="jsonfile", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(cache),
               ANSIBLE_CACHE_PLUGIN_PREFIX="gpf_", ANSIBLE_NOCOLOR="1")
    bindir = os.path.dirname(sys.executable)
    proc = subprocess.run([os.path.join(bindir, "ansible-playbook"), "-i", "node-a,", "-c", "local",
                           "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook)],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = read_fact_files(str(cache), "jsonfile", prefix="gpf_")
    assert list(found) == ["node-a"]
    assert found["node-a"]["facts"]["driver"]["userspace_version"] == "595.91.07"
    assert found["node-a"]["facts"]["gpus"][3]["power"]["default_limit_w"] == 350.0


# --- bounded Xid events and wrongly shaped documents -------------------------------------------


def test_fatal_xid_finding_counts_every_line_of_a_bounded_storm():
    lines = "".join("[%12.6f] NVRM: Xid (PCI:0000:18:00): 79, pid=%d, name=x, GPU has fallen off the bus.\n"
                    % (100.0 + 70.0 * i, i) for i in range(5000))
    facts = json.loads(json.dumps(node_facts("h100", limit_w=600.0, kernel_log_text=lines)))
    assert len(facts["xid_events"]) == kernel_log.XID_EVENTS_PER_KEY + 1
    [finding] = [f for f in DriftEngine().node_findings("h1", "gpu_h100", facts, declared_state(H100_VARS))
                 if f["check"] == "fatal_xid"]
    assert finding["message"] == "fatal Xid in the current kernel log: Xid 79 ×5000"
    assert finding["actual"] == [79]


WRONG_SHAPES = {
    "driver_str": {"schema_version": 1, "driver": "ok"},
    "gpus_str": {"schema_version": 1, "driver": {"state": "ok"}, "gpus": "8"},
    "gpu_str": {"schema_version": 1, "driver": {"state": "ok"}, "gpus": ["GPU-0"]},
    "events_str": {"schema_version": 1, "driver": {"state": "ok"}, "xid_events": ["Xid 79"]},
    "summary_str": {"schema_version": 1, "driver": {"state": "ok"}, "xid_summary": "none"},
    "packages_str": {"schema_version": 1, "driver": {"state": "ok", "packages": ["nvidia-driver"]}},
    "version_int": {"schema_version": 1, "driver": {"state": "ok", "loaded_version": 580}},
    "remap_str": {"schema_version": 1, "driver": {"state": "ok"}, "gpus": [{"index": 0, "remapped_rows": "0"}]},
}


def test_wrongly_shaped_documents_are_missing_facts_and_the_report_goes_on():
    fleet = _fleet()
    for name, doc in sorted(WRONG_SHAPES.items()):
        fleet.append({"node": name, "class": "gpu_h100", "facts": doc, "declared": declared_state(H100_VARS)})
    fleet.append({"node": "text", "class": "gpu_h100", "facts": "not a document", "declared": {}})
    fleet.append({"node": "list", "class": "gpu_h100", "facts": [1, 2], "declared": {}})
    report = drift_report(fleet)
    # The four good nodes are judged as without the bad ones.
    assert report["nodes"]["h1"]["in_sync"] is True and report["nodes"]["v1"]["in_sync"] is True
    assert checks(report["nodes"]["h2"]["findings"]) == ["driver_branch", "driver_version_skew"]
    for name in list(WRONG_SHAPES) + ["text", "list"]:
        node = report["nodes"][name]
        assert checks(node["findings"]) == ["facts_missing"], name
        assert "not a facts document" in node["findings"][0]["message"], name
    for name in ("driver_str", "text", "list"):
        assert report["nodes"][name]["driver"] == {"loaded": None, "userspace": None, "on_disk": None, "branch": None,
                                                   "state": None}
    assert report["nodes"]["driver_str"]["findings"][0]["actual"] == "driver is a str, expected a mapping"
    assert report["nodes"]["gpu_str"]["findings"][0]["actual"] == "gpus[0] is a str, expected a mapping"
    assert report["summary"]["missing"] == 1 + len(WRONG_SHAPES) + 2


def test_a_bad_value_deep_in_one_node_does_not_stop_the_report():
    bad = node_facts("h100")
    bad["gpus"][0]["power"]["default_limit_w"] = "seven hundred"
    declared = declared_state(dict(H100_VARS, gpu_policy_power_limit_w=None, gpu_policy_power_limit_percent=80))
    fleet = _fleet() + [{"node": "bad", "class": "gpu_h100", "facts": bad, "declared": declared}]
    report = drift_report(fleet)
    assert checks(report["nodes"]["bad"]["findings"]) == ["facts_missing"]
    assert "could not be judged (ValueError: " in report["nodes"]["bad"]["findings"][0]["message"]
    assert report["summary"]["nodes"] == 5 and report["nodes"]["h1"]["in_sync"] is True


def test_fact_files_of_the_wrong_shape_are_source_errors(tmp_path):
    good = node_facts("h100")
    files = {
        "good": json.dumps(good),
        "text": json.dumps("hello"),
        "list": json.dumps([good]),
        "number": "42",
        "facts_str": json.dumps({"ansible_facts": "nvidia"}),
        "nvidia_str": json.dumps({"nvidia": "x"}),
        "driver_str": json.dumps({"ansible_facts": {"nvidia": {"schema_version": 1, "driver": "ok"}}}),
        "payload_str": json.dumps({"__payload__": json.dumps("x")}),
        "events_str": json.dumps(dict(good, xid_events="79")),
    }
    for host, text in files.items():
        (tmp_path / (host + ".json")).write_text(text)
    found = read_fact_files(str(tmp_path))
    assert found["good"]["error"] is None and found["good"]["facts"]["gpu_count"] == 8
    expected = {
        "text": "no nvidia facts in the file: it holds a JSON string, expected an object",
        "list": "no nvidia facts in the file: it holds a JSON array, expected an object",
        "number": "no nvidia facts in the file: it holds a JSON number, expected an object",
        "facts_str": "no nvidia facts in the file: its ansible_facts is a JSON string, expected an object",
        "nvidia_str": "no nvidia facts in the file: its nvidia is a JSON string, expected an object",
        "driver_str": "not a facts document: driver is a str, expected a mapping",
        "payload_str": "no nvidia facts in the file: it holds a JSON string, expected an object",
        "events_str": "not a facts document: xid_events is a str, expected a list",
    }
    for host, error in expected.items():
        assert (found[host]["facts"], found[host]["error"]) == (None, error), host
    report = drift_report({"node": host, "class": "gpu_h100", "facts": entry["facts"], "declared": {}}
                          for host, entry in sorted(found.items()))
    assert report["summary"]["nodes"] == len(files) and report["summary"]["missing"] == len(files) - 1


def test_ecc_on_a_gpu_without_ecc_is_not_drift():
    from pathlib import Path
    corpus = Path(__file__).resolve().parents[3] / "fixtures" / "corpus" / "smi-xml"
    no_ecc = parse_nvidia_smi_xml((corpus / "dual-rtx-2070-r590-v13.xml").read_text())["gpus"][0]
    with_ecc = parse_nvidia_smi_xml((corpus / "a100-sxm4-80gb-r535-mig-v12.xml").read_text())["gpus"][0]
    assert (no_ecc["ecc"]["supported"], no_ecc["ecc"]["mode_current"]) == (False, None)
    assert (with_ecc["ecc"]["supported"], with_ecc["ecc"]["mode_current"]) == (True, True)
    doc = node_facts("h100", limit_w=600.0)
    for gpu in doc["gpus"]:
        gpu["ecc"].update(supported=False, mode_current=None, mode_pending=None)
    report = drift_report([{"node": "w1", "class": "gpu_h100", "facts": doc, "declared": declared_state(H100_VARS)}])
    found = [f for f in report["findings"] if f["check"].startswith("ecc")]
    assert set(f["check"] for f in found) == {"ecc_not_supported"} and len(found) == 8
    assert all(f["severity"] == "info" for f in found)
    assert report["nodes"]["w1"]["in_sync"] is True
    off = node_facts("h100", limit_w=600.0, ecc=False)
    drifted = drift_report([{"node": "w2", "class": "gpu_h100", "facts": off, "declared": declared_state(H100_VARS)}])
    assert "ecc_mode" in set(f["check"] for f in drifted["findings"])
