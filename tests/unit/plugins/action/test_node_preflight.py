# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node_upgrade preflight in one task: ``plugin_utils.node_preflight`` and the ``node_preflight`` action.

The action's module calls (setup, gpu_facts, node_lock, driver_resolve) are answered by a fake
``_execute_module`` that records them: this is not an integration test (the rollout's fleet
tests run the action on the simulated fleet).
"""

from __future__ import annotations

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.nvidia.plugins.action.node_preflight import ActionModule
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts, new_gpu
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import node_preflight
from tests.unit.plugins.action.fake_node import node_action

OLD = "580.126.20"
NEW = "620.82.01"
OWNER = {"rollout_id": "driver-ltsb", "run_id": "ctl-100-1", "controller": "ctl", "pid": 100}
OPTIONS = {"rollout_id": "driver-ltsb", "drain": "none"}


def facts(version=OLD):
    doc = new_facts("nvml")
    doc["driver"].update(userspace_version=version, loaded_version=version, on_disk_version=version,
                         branch=version.split(".")[0], kernel_module_type="open", state="ok")
    for index in range(2):
        gpu = new_gpu(index)
        gpu.update(uuid="GPU-%08d-0000-0000-0000-000000000000" % index, name="NVIDIA H100 80GB HBM3",
                   architecture="hopper")
        doc["gpus"].append(gpu)
    doc["gpu_count"] = 2
    return doc


def files(**content):
    """node_lock's files read: each name's content, or ("unreadable", why)."""
    out = {}
    for name in ("flag", "lock", "snapshot", "driver", "drain", "os_reboot"):
        value = content.get(name)
        if isinstance(value, tuple):
            out[name] = {"exists": True, "content": None, "unreadable": value[1], "identity": "x"}
        else:
            out[name] = {"exists": value is not None, "content": value if isinstance(value, dict) else None,
                         "unreadable": None, "identity": "id-%s" % name if value is not None else None}
    return {"files": out, "boot_id": "boot-1"}


RESOLVED = {"resolved": {"version": NEW, "branch": "620"}, "plan": {"steps": [{"argv": ["apt-get", "install"]}]}}
LOCK_OK = {"ok": True, "takeover": False, "reasons": [], "flags": [], "lock": {}}


def test_a_flag_that_cannot_be_read_flags_the_node_and_a_bad_snapshot_is_ignored_with_a_warning():
    state = node_preflight.parse_state_files(files(flag=("unreadable", "flag file is not JSON"),
                                                   snapshot=("unreadable", "snapshot.json is not JSON"),
                                                   lock=("unreadable", "lock.json is not JSON")))
    assert state["flag"]["flagged"] is True
    assert state["flag"]["reason"].startswith("flag file is not JSON; inspect and remove it")
    assert state["lock_found"] == "lock.json is not JSON"
    assert state["saved_snapshot"] == {}
    assert state["warnings"] == ["snapshot.json is not JSON: ignored"]
    assert state["boot_id"] == "boot-1" and state["os_reboot_requested"] is False


def test_a_node_drained_by_someone_else_is_not_ours_and_is_refused_unless_allowed():
    line = "NodeName=node01 State=IDLE+DRAIN Partitions=all Reason=bad_dimm [ops@t]"
    drain = node_preflight.scheduler("slurm", line, {})
    assert drain["drain_owned"] is False and drain["sched"]["out_of_service"] is True
    state = node_preflight.parse_state_files(files())
    decision = node_preflight.decide(facts(), RESOLVED, state, LOCK_OK, drain["sched"], dict(OPTIONS, drain="slurm"))
    assert decision["preflight"]["action"] == "refuse"
    assert decision["preflight"]["flags"] == ["drained_by_others"]
    assert "drained in slurm before the rollout (bad_dimm, ops@t): its state is unknown" in \
        decision["preflight"]["reasons"][0]
    allowed = node_preflight.decide(facts(), RESOLVED, state, LOCK_OK, drain["sched"],
                                    dict(OPTIONS, drain="slurm", allow_drained=True))
    assert allowed["preflight"]["action"] == "upgrade" and allowed["target"] == NEW
    # Our own drain record makes the drain ours.
    assert node_preflight.scheduler("slurm", line, {"rollout_id": "driver-ltsb"})["drain_owned"] is True
    assert node_preflight.scheduler("none", "", {})["drain_owned"] is False


def test_a_driver_that_cannot_be_resolved_and_a_held_lock_refuse_naming_both():
    lock = {"ok": False, "takeover": False, "reasons": ["locked by run other-1"], "flags": ["locked"], "lock": {}}
    state = node_preflight.parse_state_files(files())
    decision = node_preflight.decide(facts(), {"failed": True, "msg": "R620 dropped Volta"}, state, lock, {},
                                     OPTIONS)
    assert decision["preflight"]["action"] == "refuse"
    assert decision["preflight"]["reasons"][:2] == ["R620 dropped Volta", "locked by run other-1"]
    assert decision["preflight"]["flags"][:2] == ["resolution", "locked"]
    assert decision["target"] == ""


def test_an_upgrade_staged_for_a_slurm_reboot_goes_on_to_its_staged_target():
    snapshot = {"rollout_id": "driver-ltsb", "run_id": "ctl-99-1", "staged": {"target": NEW}, "completed": False}
    state = node_preflight.parse_state_files(files(snapshot=snapshot))
    decision = node_preflight.decide(facts(NEW), RESOLVED, state, LOCK_OK, {}, dict(OPTIONS, drain="slurm_reboot"))
    assert decision["staged"] is True and decision["target"] == NEW
    assert decision["preflight"]["action"] == "upgrade"
    assert decision["preflight"]["notes"] == ["staged %s for a reboot Slurm runs" % NEW]


def test_a_node_on_target_and_pinned_is_skipped():
    state = node_preflight.parse_state_files(files())
    pinned = {"resolved": {"version": NEW, "branch": "620"}, "plan": {"steps": []}}
    decision = node_preflight.decide(facts(NEW), pinned, state, LOCK_OK, {}, OPTIONS)
    assert decision["preflight"]["action"] == "skip"
    assert decision["left"]["left_lock"] is False and decision["left"]["unrecorded"] is False


def action(args, answers, check_mode=False):
    return node_action(ActionModule, args, answers, check_mode)


ARGS = {"files": {"flag": "/f", "lock": "/l", "snapshot": "/s", "driver": "/d", "drain": "/r", "os_reboot": "/o"},
        "owner": OWNER, "rollout_id": "driver-ltsb", "drain": "none"}


def test_action_reads_once_resolves_with_the_facts_it_read_and_decides():
    answers = {"ansible.builtin.setup": {"ansible_facts": {"ansible_distribution": "Debian",
                                                           "ansible_distribution_major_version": "12",
                                                           "ansible_distribution_version": "12.7",
                                                           "ansible_kernel": "6.1.0-25-amd64"}},
               "gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": facts()}},
               "gpufleet.nvidia.node_lock": files(lock={"run_id": "other-1", "controller": "ctl-gone", "pid": 7}),
               "gpufleet.nvidia.driver_resolve": dict(RESOLVED, changed=False, _ansible_no_log=False)}
    plugin, calls = action(dict(ARGS, resolve={"branch": "ltsb", "version": "", "today": ""}), answers)
    result = plugin.run(task_vars={"ansible_facts": {}})
    assert [name for name, _args, _check in calls] == [
        "ansible.builtin.setup", "gpufleet.nvidia.gpu_facts", "gpufleet.nvidia.node_lock", "gpufleet.nvidia.driver_resolve"]
    resolve_args = calls[3][1]
    assert resolve_args["distribution"] == "debian12" and len(resolve_args["gpus"]) == 2
    assert "version" not in resolve_args and "today" not in resolve_args  # "" means not given
    assert result["ansible_facts"]["ansible_kernel"] == "6.1.0-25-amd64"
    assert result["ansible_facts"]["nvidia"]["driver"]["loaded_version"] == OLD
    # The holder ran on another controller and this run has no lease directory: unknown, younger
    # than stale → refused, saying why.
    assert result["probe"] == {"alive": None, "reason": "the holder ran on controller ctl-gone and this run keeps no "
                                                        "lease directory to look in: its liveness is unknown"}
    assert "the holder's liveness is unknown (the holder ran on controller ctl-gone" in result["lock"]["reasons"][0]
    assert result["lock"]["ok"] is False
    assert result["decision"]["preflight"]["action"] == "refuse"
    assert "_ansible_no_log" not in result["resolve"]
    # The decision read the plan; the result keeps what the role reads (every byte of it is copied
    # and walked by ansible-playbook's process).
    assert result["resolve"] == {"resolved": {"version": NEW, "branch": "620"}}


def test_action_without_resolve_only_reads_and_a_failing_module_fails_it_by_name():
    answers = {"gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": facts()}, "warnings": ["kernel log unreadable"]},
               "gpufleet.nvidia.node_lock": files(drain=("unreadable", "drain.json is not JSON"))}
    known = {"ansible_facts": {"distribution": "Debian", "kernel": "6.1.0-25-amd64"}, "inventory_hostname": "node07"}
    plugin, calls = action(dict(ARGS), answers)
    result = plugin.run(task_vars=known)
    assert [name for name, _args, _check in calls] == ["gpufleet.nvidia.gpu_facts", "gpufleet.nvidia.node_lock"]
    assert "decision" not in result and result["lock"]["ok"] is True and result["probe"] is None
    # The modules' warnings are passed on, each warning names the node.
    assert result["warnings"] == ["node07: kernel log unreadable", "node07: drain.json is not JSON: ignored"]
    answers["gpufleet.nvidia.node_lock"] = {"failed": True, "msg": "/l is a directory"}
    plugin, _calls = action(dict(ARGS), answers)
    with pytest.raises(AnsibleActionFail, match=r"read the node's state files \(gpufleet.nvidia.node_lock\): /l is a directory"):
        plugin.run(task_vars=known)
    plugin, _calls = action(dict(ARGS, drain="sometimes"), answers)
    with pytest.raises(AnsibleActionFail, match="drain"):
        plugin.run(task_vars=known)


def test_field_case_36_a_node_cordoned_by_someone_else_is_refused_and_stays_not_ours():
    # Field case 36 (gpu-operator #2820): a node cordoned before the rollout, with no drain record of
    # ours, is not upgraded unless asked, and is not returned to service by the rollout.
    drain = node_preflight.scheduler("kubernetes", "true", {})
    assert drain["sched"]["out_of_service"] is True and drain["drain_owned"] is False
    decision = node_preflight.decide(facts(), RESOLVED, node_preflight.parse_state_files(files()), LOCK_OK,
                                     drain["sched"], dict(OPTIONS, drain="kubernetes"))
    assert decision["preflight"]["action"] == "refuse" and "drained_by_others" in decision["preflight"]["flags"]
    # A cordon this collection made (its drain record) is its own to undo.
    assert node_preflight.scheduler("kubernetes", "true", {"rollout_id": "driver-ltsb"})["drain_owned"] is True


def test_extra_vars_given_as_strings_are_converted_and_bad_ones_named():
    answers = {"gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": facts()}},
               "gpufleet.nvidia.node_lock": files(lock={"run_id": "other-1", "controller": "ctl", "pid": 1})}
    known = {"ansible_facts": {"distribution": "Debian", "kernel": "6.1.0-25-amd64"}}
    # lock_stale_s "0" (never stale) and lock_break "true" as -e gives them: the lock is broken.
    plugin, _calls = action(dict(ARGS, lock_stale_s="0", lock_break="true", ignore_xids=["79"]), answers)
    result = plugin.run(task_vars=known)
    assert result["lock"]["ok"] is True and result["lock"]["takeover"] is True
    plugin, _calls = action(dict(ARGS, lock_stale_s="six hours"), answers)
    with pytest.raises(AnsibleActionFail, match="node_preflight: .*lock_stale_s"):
        plugin.run(task_vars=known)


def _answer_lock(reads, acquired=True, reason=None):
    """node_lock's answers by state: the read, the take (acquired or not, naming the holder), writes."""
    def answer(module_args):
        if module_args.get("state") == "acquire":
            return {"changed": acquired, "acquired": acquired, "reason": reason}
        if module_args.get("state") == "write":
            return {"changed": True, "written": True}
        return reads
    return answer


UPGRADE = dict(ARGS, resolve={"branch": "ltsb"}, take_lock=True,
               drain_record={"path": "/r", "reason": "gpufleet driver-ltsb: driver rollout"})
KNOWN = {"ansible_facts": {"distribution": "Debian", "distribution_major_version": "12", "kernel": "6.1.0-25-amd64"},
         "inventory_hostname": "node03"}


def test_an_upgraded_node_has_its_lock_taken_by_compare_and_swap_and_its_drain_recorded_first():
    # A drain record of an earlier rollout (a rollback left the node drained): the first drainer is kept.
    reads = files(drain={"backend": "slurm", "rollout_id": "driver-580", "first_drained_by": "driver-575"})
    answers = {"gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": facts()}},
               "gpufleet.nvidia.node_lock": _answer_lock(reads),
               "gpufleet.nvidia.driver_resolve": RESOLVED}
    plugin, calls = action(dict(UPGRADE, drain="slurm", scheduler_output=(
        "NodeName=node03 State=IDLE+DRAIN Partitions=all Reason=gpufleet_driver-580 [root@t]")), answers)
    result = plugin.run(task_vars=dict(KNOWN))
    assert result["decision"]["preflight"]["action"] == "upgrade"
    assert [(name, a.get("state")) for name, a, _check in calls] == [
        ("gpufleet.nvidia.gpu_facts", None), ("gpufleet.nvidia.node_lock", None),
        ("gpufleet.nvidia.driver_resolve", None), ("gpufleet.nvidia.node_lock", "acquire"),
        ("gpufleet.nvidia.node_lock", "write")]
    take = calls[3][1]
    assert take["path"] == "/l" and take["expect"] == ""  # no lock file was found: expect none
    record = calls[4][1]
    assert record["path"] == "/r"
    assert record["content"]["backend"] == "slurm" and record["content"]["run_id"] == "ctl-100-1"
    assert record["content"]["first_drained_by"] == "driver-575"
    assert record["content"]["reason"] == "gpufleet driver-ltsb: driver rollout"
    assert result["lock_taken"] is True and result["drain_recorded"] is True and result["changed"] is True
    # A scheduler drains the node later (tasks/drain.yml marks it); only "started" is marked here.
    assert sorted(result["marks"]) == ["started"]


def test_a_lock_another_controller_took_first_refuses_the_node_naming_it_and_writes_nothing():
    answers = {"gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": facts()}},
               "gpufleet.nvidia.node_lock": _answer_lock(files(), acquired=False,
                                                         reason="locked by rollout driver-ltsb run ctl2-7-1 on ctl2"),
               "gpufleet.nvidia.driver_resolve": RESOLVED}
    plugin, calls = action(UPGRADE, answers)
    result = plugin.run(task_vars=dict(KNOWN))
    assert [a.get("state") for name, a, _check in calls if name == "gpufleet.nvidia.node_lock"] == [None, "acquire"]
    assert result["lock_taken"] is False and result["drain_recorded"] is False
    assert result["lock"]["ok"] is False and result["lock"]["flags"] == ["locked"]
    preflight = result["decision"]["preflight"]
    assert preflight["action"] == "refuse" and preflight["flags"][0] == "locked"
    assert preflight["reasons"][0] == "locked by rollout driver-ltsb run ctl2-7-1 on ctl2"


def test_without_a_scheduler_the_drain_is_marked_at_once_and_check_mode_takes_nothing():
    answers = {"gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": facts()}},
               "gpufleet.nvidia.node_lock": _answer_lock(files()),
               "gpufleet.nvidia.driver_resolve": RESOLVED}
    plugin, calls = action(UPGRADE, answers)
    result = plugin.run(task_vars=dict(KNOWN))
    assert sorted(result["marks"]) == ["drained", "started"]
    # No scheduler, no record of a drain to undo: nothing but the lock is written.
    assert [a.get("state") for name, a, _check in calls if name == "gpufleet.nvidia.node_lock"] == [None, "acquire"]
    plugin, calls = action(UPGRADE, answers)
    plugin._task.check_mode = True
    result = plugin.run(task_vars=dict(KNOWN))
    assert result["lock_taken"] is None
    assert [a.get("state") for name, a, _check in calls if name == "gpufleet.nvidia.node_lock"] == [None]


def test_the_drain_record_is_one_function_for_the_action_and_the_drain_tasks():
    from ansible_collections.gpufleet.nvidia.plugins.filter.rollout import rollout_drain_record

    first = node_preflight.drain_record({}, "kubernetes", "driver-ltsb", "ctl-100-1", "ignored", "2026-12-05T06:00:00Z")
    assert first == {"backend": "kubernetes", "rollout_id": "driver-ltsb", "run_id": "ctl-100-1", "reason": None,
                     "drained_at": "2026-12-05T06:00:00Z", "first_drained_by": "driver-ltsb"}
    # The filter tasks/drain.yml writes with is the same function; the first drainer is kept.
    again = rollout_drain_record(first, "slurm", "driver-620", "ctl-200-1", "gpufleet: rollout", "2026-12-06T06:00:00Z")
    assert again["first_drained_by"] == "driver-ltsb" and again["reason"] == "gpufleet: rollout"
    assert rollout_drain_record(None, "none", "r", "x", "", "t")["first_drained_by"] == "r"


def test_an_upgrade_gets_another_rollouts_snapshot_without_its_evidence_and_a_rollback_gets_all_of_it():
    other = {"rollout_id": "driver-580", "run_id": "ctl-1-1", "completed": True, "result": "upgraded",
             "facts": facts(), "local_facts": {"known_good": OLD}, "trace": {"csv": "t\n0\n"}, "benchmark": 1.0}
    ours = dict(other, rollout_id="driver-ltsb", completed=False)
    answers = {"ansible.builtin.setup": {"ansible_facts": {"ansible_distribution": "Debian",
                                                           "ansible_distribution_major_version": "12",
                                                           "ansible_distribution_version": "12.7",
                                                           "ansible_kernel": "6.1.0-25-amd64"}},
               "gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": facts()}},
               "gpufleet.nvidia.node_lock": files(snapshot=other),
               "gpufleet.nvidia.driver_resolve": dict(RESOLVED, changed=False)}
    upgrade = dict(ARGS, resolve={"branch": "ltsb"})
    plugin, _calls = action(upgrade, answers)
    saved = plugin.run(task_vars={"ansible_facts": {}})["state"]["saved_snapshot"]
    assert saved == {"rollout_id": "driver-580", "run_id": "ctl-1-1", "completed": True, "result": "upgraded"}
    # This rollout's own snapshot (an interrupted attempt to resume) keeps its evidence.
    answers["gpufleet.nvidia.node_lock"] = files(snapshot=ours)
    plugin, _calls = action(upgrade, answers)
    result = plugin.run(task_vars={"ansible_facts": {}})
    assert result["state"]["saved_snapshot"] == ours
    assert result["decision"]["preflight"]["action"] == "upgrade"
    # This rollout's snapshot, closed: nothing reads its evidence any more.
    answers["gpufleet.nvidia.node_lock"] = files(snapshot=dict(ours, completed=True))
    plugin, _calls = action(upgrade, answers)
    assert "facts" not in plugin.run(task_vars={"ansible_facts": {}})["state"]["saved_snapshot"]
    # ... unless a run killed before it recorded the node upgraded it: its before-state is the record's.
    assert node_preflight.snapshot_for_upgrade(dict(ours, completed=True), "driver-ltsb", True)["facts"] == ours["facts"]
    assert node_preflight.snapshot_for_upgrade("not a mapping", "driver-ltsb", False) == "not a mapping"
    # A rollback's read (no resolve) returns another rollout's snapshot whole: its facts are the target.
    answers["gpufleet.nvidia.node_lock"] = files(snapshot=other)
    plugin, _calls = action(dict(ARGS), answers)
    assert plugin.run(task_vars={"ansible_facts": {}})["state"]["saved_snapshot"]["facts"]["driver"]["loaded_version"] == OLD


def test_case_41_a_node_slurm_drained_for_its_gpu_count_is_refused_as_a_gpu_fault():
    line = ("NodeName=yigou-dev-102-68 Gres=gpu:nvidia-rtx-3090:1 State=IDLE+DRAIN Partitions=compute100 "
            "CfgTRES=cpu=8,mem=1M,billing=8,gres/gpu=1 "
            "Reason=gres/gpu count reported lower than configured (0 < 1) [slurm@2024-12-19T11:03:34]")
    drain = node_preflight.scheduler("slurm", line, {}, "yigou-dev-102-68")
    assert drain["sched"]["drain_kind"] == "gpu_count" and drain["drain_owned"] is False
    decision = node_preflight.decide(facts(), RESOLVED, node_preflight.parse_state_files(files()), LOCK_OK,
                                     drain["sched"], dict(OPTIONS, drain="slurm"))
    assert decision["preflight"]["action"] == "refuse"
    assert decision["preflight"]["flags"] == ["drained_by_others", "gpu_count_drain"]
    assert decision["preflight"]["reasons"][0].startswith(
        "drained in slurm before the rollout (drained by Slurm itself: Slurm sees 0 of 1 configured GPUs (gres/gpu "
        "count reported lower than configured (0 < 1), slurm@2024-12-19T11:03:34): a GPU or driver fault, not a "
        "maintenance hold;")
    with pytest.raises(ValueError, match="answered for node 'yigou-dev-102-68', not for 'node02'"):
        node_preflight.scheduler("slurm", line, {}, "node02")
