# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Phases of the node_upgrade transaction in one task: the ``node_transaction`` action.

Its module calls (gpu_trace, node_lock, gpu_facts, slurp, kernel_hold, driver_known_good) are
answered by a fake ``_execute_module`` that records them: this is not an integration test (the
rollout's fleet tests run the action on the simulated fleet).
"""

from __future__ import annotations

import base64
import json
import os
from unittest import mock

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.nvidia.plugins.action.node_transaction import ActionModule
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts, new_gpu
from tests.unit.plugins.action.fake_node import node_action

OLD = "580.126.20"
NEW = "620.82.01"


def facts(version=OLD, gpus=2):
    doc = new_facts("nvml")
    doc["driver"].update(userspace_version=version, loaded_version=version, on_disk_version=version,
                         branch=version.split(".")[0], kernel_module_type="open", state="ok")
    for index in range(gpus):
        gpu = new_gpu(index)
        gpu.update(uuid="GPU-%08d-0000-0000-0000-000000000000" % index, name="NVIDIA H100 80GB HBM3",
                   architecture="hopper")
        doc["gpus"].append(gpu)
    doc["gpu_count"] = gpus
    return doc


def action(args, answers, check_mode=False):
    return node_action(ActionModule, args, answers, check_mode)


BASE = {"rollout_id": "driver-ltsb", "run_id": "ctl-100-1", "stage": "waves", "target": NEW}
TRACE = {"csv": "time_s,gpu\n0.0,0\n", "summary": {"0000:18:00.0": {"samples": 6}}, "changes": None}
BOOT = {"content": base64.b64encode(b"boot-2\n").decode()}


def test_snapshot_traces_saves_and_marks_and_an_interrupted_attempt_keeps_its_own():
    answers = {"gpufleet.nvidia.gpu_trace": dict(TRACE), "gpufleet.nvidia.node_lock": {"changed": True}}
    args = dict(BASE, phases=["snapshot"], marks={"started": 1.0},
                snapshot={"path": "/var/lib/gpufleet/rollout/snapshot.json", "saved": {}, "boot_id": "boot-1",
                          "local_facts": {"current": {"version": OLD}}},
                trace={"enabled": True, "duration_s": 3, "interval_s": 0.5})
    plugin, calls = action(args, answers)
    result = plugin.run(task_vars={"ansible_facts": {"nvidia": facts()}})
    assert [name for name, _a, _c in calls] == ["gpufleet.nvidia.gpu_trace", "gpufleet.nvidia.node_lock"]
    assert calls[0][1] == {"duration_s": 3.0, "interval_s": 0.5}
    saved = calls[1][1]
    assert saved["state"] == "write" and saved["path"] == "/var/lib/gpufleet/rollout/snapshot.json"
    snapshot = result["tx"]["snapshot"]
    assert snapshot is saved["content"] or snapshot == saved["content"]
    assert snapshot["facts"]["driver"]["loaded_version"] == OLD and snapshot["boot_id"] == "boot-1"
    assert snapshot["trace"]["csv"] == TRACE["csv"] and snapshot["benchmark"] is None
    assert snapshot["resumed"] is False and result["changed"] is True
    assert result["tx"]["marks"]["started"] == 1.0 and result["tx"]["marks"]["snapshot"] >= 1.0
    # The same rollout, cut off after its install: its snapshot (facts of before) is kept, nothing traced or written.
    kept = dict(snapshot, facts=facts(OLD, gpus=2))
    plugin, calls = action(dict(args, snapshot=dict(args["snapshot"], saved=kept)), answers)
    result = plugin.run(task_vars={"ansible_facts": {"nvidia": facts(NEW)}})
    assert calls == [] and result["tx"]["snapshot"]["resumed"] is True and result["changed"] is False


def test_a_failing_benchmark_fails_the_snapshot_and_a_trace_without_a_driver_is_left_out():
    failing = {"failed": True, "msg": "gemm exited 3"}
    args = dict(BASE, phases=["snapshot"], snapshot={"path": "/s", "saved": None, "boot_id": "b"},
                benchmark={"command": ["/opt/bench/gemm"]})
    plugin, _calls = action(args, {"gpufleet.nvidia.gpu_trace": failing, "gpufleet.nvidia.node_lock": {}})
    result = plugin.run(task_vars={})
    assert result["failed"] is True and result["msg"] == "the benchmark failed (gpufleet.nvidia.gpu_trace): gemm exited 3"
    assert "snapshot" not in result["tx"]["marks"]  # nothing to roll back: the rescue sees no snapshot mark
    plugin, calls = action(dict(args, benchmark={}), {"gpufleet.nvidia.gpu_trace": failing,
                                                      "gpufleet.nvidia.node_lock": {"changed": True}})
    result = plugin.run(task_vars={})
    assert not result.get("failed") and result["tx"]["snapshot"]["trace"] is None
    assert [name for name, _a, _c in calls] == ["gpufleet.nvidia.gpu_trace", "gpufleet.nvidia.node_lock"]


def _tail_answers(after, known_good_failed=False):
    return {"gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": after}},
            "ansible.builtin.slurp": BOOT,
            "gpufleet.nvidia.gpu_trace": dict(TRACE),
            "gpufleet.nvidia.kernel_hold": {"changed": True, "running_kernel": "6.1.0-25-amd64",
                                            "held": ["linux-image-6.1.0-25-amd64"]},
            "gpufleet.nvidia.driver_known_good": ({"failed": True, "msg": "loaded 580.126.20 is not the installed"}
                                                  if known_good_failed else {"changed": True, "last_known_good": NEW})}


SNAPSHOT = {"rollout_id": "driver-ltsb", "boot_id": "boot-1", "facts": facts(OLD), "local_facts": {},
            "trace": {"csv": "x", "summary": {"0000:18:00.0": {"samples": 6}}}, "benchmark": None}


def test_the_tail_verifies_checks_holds_the_kernel_and_marks_known_good_in_one_task():
    args = dict(BASE, phases=["known_good", "verify", "hold_kernel", "check"], tx={"snapshot": SNAPSHOT, "marks": {"snapshot": 2.0}},
                verify={"golden_report_dir": ""}, kernel_hold={"packages_extra": ["linux-headers-amd64"]},
                known_good={"path": "/etc/ansible/facts.d/gpufleet_driver.fact", "history_limit": 20})
    plugin, calls = action(args, _tail_answers(facts(NEW)))
    result = plugin.run(task_vars={"inventory_hostname": "node05"})
    # The phases run in their own order, whatever the order asked.
    # The driver state the verification read is the one recorded: the GPUs are read once.
    assert [name for name, _a, _c in calls] == [
        "gpufleet.nvidia.gpu_facts", "ansible.builtin.slurp", "gpufleet.nvidia.gpu_trace",
        "gpufleet.nvidia.kernel_hold", "gpufleet.nvidia.driver_known_good"]
    assert calls[2][1]["baseline"] == SNAPSHOT["trace"]["summary"]
    assert calls[3][1]["packages_extra"] == ["linux-headers-amd64"] and calls[3][1]["state"] == "present"
    assert calls[4][1] == {"path": "/etc/ansible/facts.d/gpufleet_driver.fact", "loaded_version": NEW,
                           "driver_state": "ok", "history_limit": 20}
    tx = result["tx"]
    assert tx["verdict"]["ok"] is True and tx["after_boot_id"] == "boot-2"
    # The snapshot ran 580.126.20 healthy: a rollback target exists.
    assert tx["verify_options"]["before_boot_id"] == "boot-1" and tx["verify_options"]["rollback_available"] is True
    assert tx["trace_after"] == {"csv": TRACE["csv"], "changes": None}
    assert tx["kernel_hold"]["held"] == ["linux-image-6.1.0-25-amd64"]
    assert tx["phases_done"] == ["verify", "check", "hold_kernel", "known_good"]
    assert sorted(tx["marks"]) == ["snapshot", "verified"]
    assert result["ansible_facts"]["nvidia"]["driver"]["loaded_version"] == NEW and result["changed"] is True


def test_a_node_that_fails_verification_stops_the_phases_and_keeps_the_verdict_for_the_rescue():
    lost = facts(NEW, gpus=1)
    args = dict(BASE, phases=["verify", "check", "hold_kernel", "known_good"], tx={"snapshot": SNAPSHOT},
                verify={"rollback_version": OLD})
    plugin, calls = action(args, _tail_answers(lost))
    result = plugin.run(task_vars={})
    assert result["failed"] is True
    assert result["msg"].startswith("verification failed on 620.82.01: ")
    assert [name for name, _a, _c in calls] == ["gpufleet.nvidia.gpu_facts", "ansible.builtin.slurp"]
    verdict = result["tx"]["verdict"]
    assert verdict["ok"] is False and verdict["rollback"] is True
    assert verdict["gpu_count"] == {"before": 2, "after": 1}
    assert result["tx"]["phases_done"] == []
    # The snapshot the caller gave is not echoed back (it keeps it): only a snapshot phase returns one.
    assert "snapshot" not in result["tx"]
    # What the phase read is what the rescue judges the node by.
    assert result["ansible_facts"]["nvidia"]["gpu_count"] == 1


def test_a_driver_that_is_not_the_installed_one_is_not_marked_known_good():
    args = dict(BASE, phases=["known_good"], tx={"snapshot": SNAPSHOT, "verdict": {"ok": True}})
    plugin, calls = action(args, _tail_answers(facts(OLD), known_good_failed=True))
    result = plugin.run(task_vars={})
    # Alone, the phase reads the driver state again (without the kernel log).
    assert calls[0][:2] == ("gpufleet.nvidia.gpu_facts", {"kernel_log": False})
    assert result["failed"] is True
    assert result["msg"] == ("record the driver as last known-good (gpufleet.nvidia.driver_known_good): "
                             "loaded 580.126.20 is not the installed")
    assert result["tx"]["verdict"] == {"ok": True}


def test_the_class_golden_contract_is_read_from_the_report_and_a_golden_node_skips_it(tmp_path):
    report = tmp_path / "report"
    (report / "nodes").mkdir(parents=True)
    (report / "plan.json").write_text(json.dumps({"nodes": [{"name": "node01", "stage": "golden", "class": "gpu_h100"}]}))
    args = dict(BASE, phases=["verify"], tx={"snapshot": SNAPSHOT},
                verify={"golden_report_dir": str(report), "node_class": "gpu_h100"})
    plugin, _calls = action(args, _tail_answers(facts(NEW)))
    result = plugin.run(task_vars={})
    # The golden node has no record yet: nothing to match.
    assert result["tx"]["verify_options"]["golden"] is None and result["tx"]["verdict"]["ok"] is True
    with mock.patch("ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_report.golden_contract") as golden:
        plugin, _calls = action(dict(args, stage="golden"), _tail_answers(facts(NEW)))
        plugin.run(task_vars={})
        assert golden.call_count == 0
    assert os.path.isdir(report)


def test_bad_arguments_and_check_mode_are_refused_before_the_node_is_touched():
    plugin, calls = action(dict(BASE, phases=["install"]), {})
    with pytest.raises(AnsibleActionFail, match="phases"):
        plugin.run(task_vars={})
    plugin, calls = action(dict(BASE, phases=["snapshot"]), {})
    result = plugin.run(task_vars={})
    assert result["failed"] is True and result["msg"] == "node_transaction: the snapshot phase needs snapshot.path"
    plugin, calls = action(dict(BASE, phases=["verify"]), {}, check_mode=True)
    with pytest.raises(AnsibleActionFail, match="outside check mode"):
        plugin.run(task_vars={})
    assert calls == []


def test_extra_vars_given_as_strings_are_converted_and_a_bad_one_is_named():
    answers = {"gpufleet.nvidia.gpu_trace": dict(TRACE), "gpufleet.nvidia.node_lock": {"changed": True}}
    args = dict(BASE, phases=["snapshot"], snapshot={"path": "/s", "saved": "", "boot_id": "b"},
                trace={"enabled": "true", "duration_s": "3", "interval_s": "0.25"},
                benchmark={"threshold": "0.8", "higher_is_better": "false"})
    plugin, calls = action(args, answers)
    result = plugin.run(task_vars={})
    assert not result.get("failed") and calls[0][1] == {"duration_s": 3.0, "interval_s": 0.25}
    plugin, calls = action(dict(args, trace={"duration_s": "three seconds"}), answers)
    with pytest.raises(AnsibleActionFail, match="duration_s"):
        plugin.run(task_vars={})
    assert calls == []


def test_snapshot_runs_the_benchmark_several_times_and_keeps_the_runs():
    results = iter(["361.5", "362.5"])
    answers = {"gpufleet.nvidia.gpu_trace": dict(TRACE, command={"stdout_lines": ["busbw", "362.0"]}),
               "ansible.builtin.command": lambda _args: {"rc": 0, "stdout_lines": [next(results)]},
               "gpufleet.nvidia.node_lock": {"changed": True}}
    args = dict(BASE, phases=["snapshot"], snapshot={"path": "/s", "saved": None, "boot_id": "b"},
                benchmark={"command": ["/opt/bench/allreduce"], "runs": 3})
    plugin, calls = action(args, answers)
    result = plugin.run(task_vars={"ansible_facts": {"nvidia": facts()}})
    assert [name for name, _a, _c in calls] == ["gpufleet.nvidia.gpu_trace", "ansible.builtin.command",
                                                "ansible.builtin.command", "gpufleet.nvidia.node_lock"]
    assert calls[1][1] == {"argv": ["/opt/bench/allreduce"]}
    snapshot = result["tx"]["snapshot"]
    assert snapshot["benchmark_runs"] == [362.0, 361.5, 362.5] and snapshot["benchmark"] == 362.0
    # A run that prints no number fails the snapshot, before anything is installed.
    answers["ansible.builtin.command"] = {"rc": 0, "stdout_lines": ["oops"]}
    plugin, _calls = action(args, answers)
    failed = plugin.run(task_vars={"ansible_facts": {"nvidia": facts()}})
    assert failed["failed"] is True and "not a number" in failed["msg"]
