# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift_report action plugin and playbooks/drift_report.yml, run by ansible-playbook on the controller.

Facts come from a directory of JSON files, so no node is contacted; the inventory gives the GPU
classes and the declared state (group_vars), as in production.
"""

from __future__ import annotations

import html
import json
import os
import shlex
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.nvidia.plugins.action.drift_report import host_classes
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts, new_gpu
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import prometheus_textfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))

INVENTORY = """\
all:
  children:
    gpu_h100:
      hosts:
        h1: {}
        h2: {}
        h3: {}
      vars:
        driver_branch: ltsb
        gpu_policy_power_limit_w: 600
        gpufleet_gpu_count: 8
    gpu_v100:
      hosts:
        v1: {}
      vars:
        driver_branch: ltsb
        gpufleet_gpu_count: 8
"""


def facts(arch, name, version, limit_w):
    doc = new_facts("nvml")
    doc["driver"].update(userspace_version=version, loaded_version=version, on_disk_version=version,
                         state="ok", branch=version.split(".")[0])
    for index in range(8):
        gpu = new_gpu(index)
        gpu.update(name=name, architecture=arch, uuid="GPU-%d" % index)
        gpu["power"].update(limit_w=limit_w, enforced_limit_w=limit_w, requested_limit_w=limit_w,
                            default_limit_w=700.0, min_limit_w=200.0, max_limit_w=700.0)
        doc["gpus"].append(gpu)
    doc["gpu_count"] = 8
    doc["xid_summary"] = {"total": 0, "incidents": 0, "by_xid": {}, "by_device": {}, "any_fatal": False,
                          "fatal_xids": [], "rate_limited": False}
    return doc


@pytest.fixture
def fleet_dir(tmp_path):
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    facts_dir = tmp_path / "facts"
    facts_dir.mkdir()
    (facts_dir / "h1.json").write_text(json.dumps(facts("Hopper", "NVIDIA H100 80GB HBM3", "620.70.06", 600.0)))
    (facts_dir / "h2.json").write_text(json.dumps(facts("Hopper", "NVIDIA H100 80GB HBM3", "620.70.06", 700.0)))
    (facts_dir / "v1.json").write_text(json.dumps(facts("Volta", "Tesla V100-SXM2-32GB", "580.95.05", 300.0)))
    return tmp_path


def run_playbook(cwd, *args):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "inventory.yml",
            "-e", "ansible_python_interpreter=%s" % sys.executable] + list(args)
    return subprocess.run(argv, cwd=str(cwd), env=env, capture_output=True, text=True, check=False)


def test_host_classes_first_matching_group():
    groups = {"all": ["a", "b", "c"], "gpu_h100": ["a"], "gpu_a100": ["a", "b"], "rack1": ["c"]}
    assert host_classes(groups, ["a", "b", "c"], "gpu_") == {"a": "gpu_a100", "b": "gpu_a100", "c": "unclassified"}


def test_drift_playbook_from_a_fact_directory(fleet_dir):
    proc = run_playbook(fleet_dir, os.path.join(REPO, "playbooks", "drift_report.yml"),
                        "-e", "drift_source=dir", "-e", "drift_path=%s" % (fleet_dir / "facts"),
                        "-e", "drift_output_dir=%s" % (fleet_dir / "out"))
    out = proc.stdout + proc.stderr
    # h2 runs 700 W against a 600 W policy, h3 has no facts: drift, so the play fails (exit 2).
    assert proc.returncode == 2, out
    assert "4 nodes: 2 in sync, 2 drifted (1 without facts); 1 critical, 8 warning findings" in out
    report = json.loads((fleet_dir / "out" / "drift-report.json").read_text())
    assert report["classes"]["gpu_h100"]["drifted_nodes"] == ["h2", "h3"]
    assert report["classes"]["gpu_v100"]["in_sync"] == 1
    assert report["source"] == "dir:%s" % (fleet_dir / "facts")
    power = [f for f in report["findings"] if f["check"] == "power_limit_w"]
    assert len(power) == 8 and power[0]["actual"] == 700.0 and power[0]["expected"] == 600.0
    markdown = (fleet_dir / "out" / "drift-report.md").read_text()
    assert "| gpu_h100 | 3 | 1 | 2 | 1 | critical | facts_missing 1, power_limit_w 8 |" in markdown
    prom = (fleet_dir / "out" / "gpufleet_drift.prom").read_text()
    assert 'gpufleet_drift_node_in_sync{Hostname="v1",class="gpu_v100",node="v1"} 1.0' in prom
    assert 'gpufleet_drift_node_findings{Hostname="h2",class="gpu_h100",node="h2",severity="warning"} 8.0' in prom
    # h2 drifted: its GPUs have series with dcgm-exporter's labels; in-sync h1's do not (prometheus_gpus=drifted).
    assert ('gpufleet_gpu_power_limit_watts{Hostname="h2",UUID="GPU-3",gpu="3",limit="enforced",modelName="NVIDIA H100 '
            '80GB HBM3",pci_bus_id=""} 700.0') in prom
    assert 'gpufleet_gpu_info{Hostname="h1"' not in prom


def test_a_node_drifted_only_by_version_skew_has_its_gpus_in_the_json_and_the_prometheus_file(tmp_path):
    # s1 and s2 are in sync by their own checks (R620 on Hopper, 600 W); two versions in one class
    # drift the older one. The action judges them, then settles the GPU summaries after that check.
    (tmp_path / "inventory.yml").write_text(
        "all:\n  children:\n    gpu_h100:\n      hosts:\n        s1: {}\n        s2: {}\n      vars:\n"
        "        driver_branch: ltsb\n        gpu_policy_power_limit_w: 600\n        gpufleet_gpu_count: 8\n")
    (tmp_path / "facts").mkdir()
    for host, version in (("s1", "620.70.06"), ("s2", "620.60.01")):
        doc = facts("Hopper", "NVIDIA H100 80GB HBM3", version, 600.0)
        for gpu in doc["gpus"]:
            gpu["pci_bus_id"] = "0000:%02x:00.0" % (0x18 + gpu["index"])
        (tmp_path / "facts" / ("%s.json" % host)).write_text(json.dumps(doc))
    proc = run_playbook(tmp_path, os.path.join(REPO, "playbooks", "drift_report.yml"), "-e", "drift_source=dir",
                        "-e", "drift_path=%s" % (tmp_path / "facts"), "-e", "drift_output_dir=out",
                        "-e", "drift_report_only=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "out" / "drift-report.json").read_text())
    assert [f["check"] for f in report["nodes"]["s2"]["findings"]] == ["driver_version_skew"]
    assert [gpu["pci_bus_id"] for gpu in report["nodes"]["s2"]["gpus"]] == ["0000:%02x:00.0" % (0x18 + i) for i in range(8)]
    assert "gpus" not in report["nodes"]["s1"]
    prom = (tmp_path / "out" / "gpufleet_drift.prom").read_text()
    assert prom.count('gpufleet_gpu_info{Hostname="s2"') == 8
    assert 'pci_bus_id="00000000:4B:00.0"' not in prom and 'pci_bus_id="00000000:1F:00.0"' in prom
    assert 'Hostname="s1",UUID=' not in prom


def _bundle_recipe():
    """The inventory and the commands of docs/drift.md's recipe from support bundles, as written there."""
    with open(os.path.join(REPO, "docs", "drift.md")) as handle:
        text = handle.read()
    section = text.split("### Without a live fleet: stored facts, or support bundles", 1)[1].split("\n## ", 1)[0]
    inventory = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    shell = section.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [shlex.split(line.split("#", 1)[0]) for line in shell.splitlines() if line.startswith("ansible-playbook")]
    return inventory, commands


def test_the_documented_recipe_turns_a_support_bundle_into_a_drift_report(tmp_path):
    inventory, commands = _bundle_recipe()
    (tmp_path / "bundles.yml").write_text(inventory.replace("/path/to/gpufleet/nvidia", REPO))
    (tmp_path / "facts").mkdir()
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    assert [argv[:2] for argv in commands] == [["ansible-playbook", "gpufleet.nvidia.facts"],
                                               ["ansible-playbook", "gpufleet.nvidia.drift_report"]]
    for argv in commands:
        argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook")] + [
            arg.replace("$PWD", str(tmp_path)) for arg in argv[1:]]
        proc = subprocess.run(argv, cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    saved = json.loads((tmp_path / "facts" / "node17.json").read_text())
    assert saved["source"] == "capture" and saved["driver"]["state"] == "broken"
    report = json.loads((tmp_path / "gpufleet-reports" / "drift" / "drift-report.json").read_text())
    assert report["source"] == "dir:%s" % (tmp_path / "facts")
    assert [(f["node"], f["check"], f["severity"]) for f in report["findings"]] == [("node17", "driver_state", "critical")]
    assert "a reboot will not fix it" in report["findings"][0]["message"]


@pytest.mark.parametrize("value, problem", [('""', 'got str ""'), ('["bundle"]', 'got list ["bundle"]')])
def test_facts_playbook_checks_gpufleet_capture_dir(tmp_path, value, problem):
    inventory, _commands = _bundle_recipe()
    (tmp_path / "inventory.yml").write_text(inventory)
    proc = run_playbook(tmp_path, os.path.join(REPO, "playbooks", "facts.yml"),
                        "-e", '{"gpufleet_capture_dir": %s}' % value)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "gpufleet_capture_dir must be the path of a support bundle directory (a non-empty string), " + problem in out
    assert "Read driver and GPU state" not in out


def test_drift_playbook_report_only_exits_zero(fleet_dir):
    proc = run_playbook(fleet_dir, os.path.join(REPO, "playbooks", "drift_report.yml"),
                        "-e", "drift_source=dir", "-e", "drift_path=%s" % (fleet_dir / "facts"),
                        "-e", "drift_output_dir=%s" % (fleet_dir / "out"), "-e", "drift_report_only=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (fleet_dir / "out" / "drift-report.md").exists()


def test_action_class_override_and_check_mode(fleet_dir):
    playbook = fleet_dir / "pb.yml"
    playbook.write_text(
        "- name: Drift\n"
        "  hosts: localhost\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Judge with a class override\n"
        "      gpufleet.nvidia.drift_report:\n"
        "        source: dir\n"
        "        path: facts\n"
        "        hosts: [h1, h2, v1]\n"
        "        declared_from: class\n"
        "        declared:\n"
        "          gpu_h100: {driver_branch: '580'}\n"
        "        output_dir: out2\n"
        "        fail_on: critical\n"
        "      register: drift\n"
        "      failed_when: false\n"
        "    - name: Show\n"
        "      ansible.builtin.debug:\n"
        "        msg: \"RESULT {{ drift | to_json }}\"\n"
    )
    proc = run_playbook(fleet_dir, "--check", str(playbook))
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    result = json.loads(out.split("RESULT ", 1)[1].split("\n")[0].rstrip('"').replace('\\"', '"'))
    # Declared R580 for the H100 class: both H100 nodes (on R620) are critical drift, V100 is fine.
    assert result["drifted_nodes"] == ["h1", "h2"]
    assert result["summary"]["by_check"] == {"driver_branch": 2}
    assert result["drift"] is True and result["exit_code"] == 2
    # Check mode writes nothing.
    assert result["paths"] == {}
    assert not (fleet_dir / "out2").exists()


def test_fact_files_of_the_wrong_shape_are_source_errors_not_a_failed_report(fleet_dir):
    facts_dir = fleet_dir / "facts"
    (facts_dir / "h3.json").write_text(json.dumps("not a facts document"))
    (facts_dir / "v1.json").write_text(json.dumps({"ansible_facts": {"nvidia": {"schema_version": 1, "driver": "ok"}}}))
    proc = run_playbook(fleet_dir, os.path.join(REPO, "playbooks", "drift_report.yml"),
                        "-e", "drift_source=dir", "-e", "drift_path=%s" % facts_dir,
                        "-e", "drift_output_dir=%s" % (fleet_dir / "out"))
    out = proc.stdout + proc.stderr
    assert "has no attribute" not in out
    # Drift (exit 2), not an error: h2 runs 700 W, h3 and v1 have no usable facts.
    assert proc.returncode == 2, out
    assert "4 nodes: 1 in sync, 3 drifted (2 without facts); 2 critical, 8 warning findings" in out
    report = json.loads((fleet_dir / "out" / "drift-report.json").read_text())
    assert sorted(report["source_errors"]) == ["h3", "v1"]
    assert report["source_errors"]["h3"].endswith(
        "h3.json: no nvidia facts in the file: it holds a JSON string, expected an object")
    assert report["source_errors"]["v1"].endswith("v1.json: not a facts document: driver is a str, expected a mapping")
    assert report["nodes"]["h1"]["in_sync"] is True
    assert [f["check"] for f in report["nodes"]["v1"]["findings"]] == ["facts_missing"]


def test_templated_declarations_are_read_per_host_and_host_vars_count(tmp_path):
    # gpu_h100 declares its GPU count through a template of a host variable: each host gets its own.
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_h100:\n      hosts:\n        h1: {gpus_here: 8}\n        h2: {gpus_here: 4}\n"
        "        h3: {gpus_here: 8}\n      vars:\n        gpufleet_gpu_count: \"{{ gpus_here }}\"\n"
        "    gpu_v100:\n      hosts:\n        v1: {}\n        v2: {}\n      vars:\n        gpu_policy_power_limit_w: 300\n")
    (tmp_path / "inventory" / "host_vars").mkdir()
    (tmp_path / "inventory" / "host_vars" / "v2.yml").write_text("gpu_policy_power_limit_w: 250\n")
    facts_dir = tmp_path / "facts"
    facts_dir.mkdir()
    for host in ("h1", "h2", "h3"):
        (facts_dir / ("%s.json" % host)).write_text(json.dumps(facts("Hopper", "NVIDIA H100 80GB HBM3", "620.70.06", 700.0)))
    for host in ("v1", "v2"):
        (facts_dir / ("%s.json" % host)).write_text(json.dumps(facts("Volta", "Tesla V100-SXM2-32GB", "580.95.05", 300.0)))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               ANSIBLE_LOCALHOST_WARNING="False")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "inventory",
                           "-e", "ansible_python_interpreter=%s" % sys.executable,
                           os.path.join(REPO, "playbooks", "drift_report.yml"), "-e", "drift_source=dir",
                           "-e", "drift_path=%s" % facts_dir, "-e", "drift_output_dir=out", "-e", "drift_report_only=true"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "out" / "drift-report.json").read_text())
    # h2 declares 4 GPUs (its own gpus_here) and has 8; v2's host_vars ask 250 W on GPUs at 300 W.
    assert sorted(n for n, node in report["nodes"].items() if not node["in_sync"]) == ["h2", "v2"]
    assert [(f["check"], f["expected"], f["actual"]) for f in report["nodes"]["h2"]["findings"]] == [("gpu_count", 4, 8)]
    assert {f["check"] for f in report["nodes"]["v2"]["findings"]} == {"power_limit_w"}


def _fleet_cache():
    sys.path.insert(0, os.path.join(REPO, "benchmarks", "drift"))
    try:
        import fleet_cache  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    return fleet_cache


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory):
    """A 40-node cache in both forms, multiplied from setup + gpu_facts output of one real run."""
    fleet_cache = _fleet_cache()
    root = tmp_path_factory.mktemp("cache")
    (root / "seed").mkdir()
    seed = fleet_cache.seed_cache(str(root / "seed"), sys.executable)
    fleet = fleet_cache.write_fleet(str(root / "fleet"), seed, 40, drift_every=7, missing_every=13, override_every=10)
    return fleet_cache, fleet


@pytest.mark.parametrize("form,declared_from", [("cache_219", "host"), ("cache_awx", "host"), ("cache_219", "class")])
def test_counts_on_a_generated_cache_in_both_forms(real_cache, tmp_path, form, declared_from):
    fleet_cache, fleet = real_cache
    if form == "cache_219":
        assert sorted(os.listdir(fleet[form]))[0] == "s1_h100-00000"
        assert json.loads((open(os.path.join(fleet[form], "s1_h100-00000")).read())).keys() == {"__payload__"}
    else:
        assert "ansible_nodename" in json.loads(open(os.path.join(fleet[form], "h100-00000")).read())
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               ANSIBLE_LOCALHOST_WARNING="False")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", fleet["inventory"],
                           "-e", "ansible_python_interpreter=%s" % sys.executable,
                           os.path.join(REPO, "playbooks", "drift_report.yml"), "-e", "drift_source=jsonfile",
                           "-e", "drift_path=%s" % fleet[form], "-e", "drift_output_dir=out", "-e", "drift_report_only=true",
                           "-e", "drift_declared_from=%s" % declared_from, "-e", "drift_workers=2"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "out" / "drift-report.json").read_text())["summary"]
    got = dict((key, summary[key]) for key in ("nodes", "in_sync", "drifted", "missing"))
    # Nodes 12, 25, 38 have no file; 6, 13, 20, 27, 34 drift (power, persistence, version, GPU lost,
    # power); 5, 15, 35 declare 650 W in host_vars and run 650 W: drifted only when host_vars are not read.
    if declared_from == "host":
        assert got == {"nodes": 40, "in_sync": 32, "drifted": 8, "missing": 3}
    else:
        assert got == {"nodes": 40, "in_sync": 29, "drifted": 11, "missing": 3}
    assert got == fleet_cache.expected_counts(fleet["layout"], declared_from)
    assert summary["by_check"]["gpu_count"] == 1 and summary["by_check"]["facts_missing"] == 3


def test_rollout_report_metrics_join_the_textfile_and_a_bad_one_is_refused(fleet_dir):
    rollout_dir = fleet_dir / "rollout"
    rollout_dir.mkdir()
    (rollout_dir / "rollout-report.json").write_text(json.dumps({
        "rollout_id": "r1", "status": "stopped", "stop_reason": "canary node a1 failed: gpu_count",
        "nodes": [{"node": "h1", "class": "gpu_h100", "stage": "golden", "result": "upgraded"},
                  {"node": "a1", "class": "gpu_a100", "stage": "canary", "result": "rolled_back"}],
        "stages": [{"name": "golden", "counts": {"upgraded": 1}}, {"name": "canary", "counts": {"rolled_back": 1}}],
        "budgets": {"gpu_a100": {"nodes": 1, "free": 0, "out_of_service": 1, "failed": 1, "failure_budget": 1}}}))
    args = [os.path.join(REPO, "playbooks", "drift_report.yml"), "-e", "drift_source=dir",
            "-e", "drift_path=%s" % (fleet_dir / "facts"), "-e", "drift_output_dir=out", "-e", "drift_report_only=true"]
    proc = run_playbook(fleet_dir, *(args + ["-e", "drift_rollout_report=%s" % rollout_dir]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    prom = (fleet_dir / "out" / "gpufleet_drift.prom").read_text()
    assert 'gpufleet_rollout_nodes{class="gpu_a100",result="rolled_back",rollout_id="r1"} 1.0' in prom
    assert 'gpufleet_rollout_stopped{rollout_id="r1"} 1.0' in prom
    assert 'gpufleet_rollout_failure_budget_left_nodes{class="gpu_a100",rollout_id="r1"} 0.0' in prom
    (rollout_dir / "rollout-report.json").write_text("[]")
    proc = run_playbook(fleet_dir, *(args + ["-e", "drift_rollout_report=%s" % rollout_dir]))
    assert proc.returncode != 0
    assert "is not a rollout report (no list of nodes)" in proc.stdout + proc.stderr


def _without_prometheus_client(tmp_path):
    """An environment whose Pythons cannot import prometheus_client, as on a controller with ansible-core
    alone: a module of that name first on PYTHONPATH that raises ImportError (forked workers inherit it)."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "prometheus_client.py").write_text("raise ImportError('No module named prometheus_client')\n")
    return {"PYTHONPATH": os.pathsep.join([str(hide)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


def _drift_playbook_without_prometheus_client(fleet_dir, *extra):
    """playbooks/drift_report.yml over the fleet's fact directory with prometheus_client hidden: the process."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
               **_without_prometheus_client(fleet_dir))
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "inventory.yml",
                           "-e", "ansible_python_interpreter=%s" % sys.executable,
                           os.path.join(REPO, "playbooks", "drift_report.yml"), "-e", "drift_source=dir",
                           "-e", "drift_path=%s" % (fleet_dir / "facts"), "-e", "drift_output_dir=out"] + list(extra),
                          cwd=str(fleet_dir), env=env, capture_output=True, text=True, check=False)


def test_default_formats_without_prometheus_client_write_the_others_and_say_so_once(fleet_dir):
    proc = _drift_playbook_without_prometheus_client(fleet_dir)
    out = proc.stdout + proc.stderr
    # The drift verdict as with prometheus_client: h2 drifted, h3 without facts (exit 2).
    assert proc.returncode == 2, out
    assert "4 nodes: 2 in sync, 2 drifted (1 without facts); 1 critical, 8 warning findings" in out
    written = sorted(os.listdir(str(fleet_dir / "out")))
    assert written == ["drift-report.html", "drift-report.json", "drift-report.junit.xml", "drift-report.md"]
    prom = str(fleet_dir / "out" / "gpufleet_drift.prom")
    note = ("the Prometheus textfile %s was not written: the controller's Python (%s) has no prometheus_client; "
            "to get it, install the collection's controller requirements (%s -m pip install -r " % (
                prom, sys.executable, sys.executable))
    # Once as a warning of the run (the printed Markdown report repeats the report's own line).
    assert out.count("[WARNING]: drift_report: " + note) == 1, out
    assert "/gpufleet/nvidia/requirements.txt) and run the report again; every other format was written" in out
    report = json.loads((fleet_dir / "out" / "drift-report.json").read_text())
    assert list(report["skipped_outputs"]) == ["prometheus"] and report["skipped_outputs"]["prometheus"].startswith(note)
    assert os.path.isfile(report["skipped_outputs"]["prometheus"].split(" -m pip install -r ")[1].split(")")[0])
    for name in ("drift-report.md", "drift-report.html"):
        assert html.unescape((fleet_dir / "out" / name).read_text()).count(note) == 1, name
    assert "prometheus" not in (fleet_dir / "out" / "drift-report.junit.xml").read_text().lower()


def test_prometheus_asked_for_without_prometheus_client_fails_with_the_clear_message(fleet_dir):
    proc = _drift_playbook_without_prometheus_client(fleet_dir, "-e", '{"drift_formats": ["json", "prometheus"]}')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    # The remedy of the warning given when the default formats skip the file: the same Python, the same command.
    remedy = ("the controller's Python (%s) has no prometheus_client; to get it, install the collection's controller "
              "requirements (%s -m pip install -r %s) and run the report again" % (
                  sys.executable, sys.executable, prometheus_textfile.REQUIREMENTS))
    assert ("drift_report: the Prometheus output was asked for (formats names prometheus) but %s, or leave prometheus "
            "out of the formats" % remedy) in out, out
    assert os.path.isfile(prometheus_textfile.REQUIREMENTS)
    # Nothing judged or written: asked for, the textfile is not skipped.
    assert not (fleet_dir / "out").exists()
