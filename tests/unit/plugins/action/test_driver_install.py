# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver role's repository and transaction in one task: the ``driver_install`` action.

Its module calls (driver_apt_repository, uri, gpu_facts, driver_transaction) are answered by a
fake ``_execute_module`` that records them: this is not an integration test (the driver role's
fleet tests and the rollout run the action on the simulated fleet's real apt).
"""

from __future__ import annotations


import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.nvidia.plugins.action.driver_install import ActionModule
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts
from tests.unit.plugins.action.fake_node import node_action
from tests.unit.plugins.module_utils.test_driver_repository_key import KEY, PRIMARY

DEBIAN = {"distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.7",
          "kernel": "6.1.0-25-amd64", "pkg_mgr": "apt"}
MIRROR = "http://127.0.0.1:24500/node01/debian12/x86_64/"


def nvidia(loaded="580.126.20"):
    doc = new_facts("nvml")
    doc["driver"].update(loaded_version=loaded, userspace_version=loaded, on_disk_version=loaded, state="ok")
    return doc


def action(args, answers, check_mode=False):
    return node_action(ActionModule, args, answers, check_mode)


TRANSACTION = {"changed": True, "resolved": {"version": "620.82.01", "branch": "620"}, "action": "upgrade",
               "plan": {"current_version": "580.126.20", "steps": [], "package_manager": "apt"}, "local_facts": {}}
ANSWERS = {"gpufleet.nvidia.driver_apt_repository": {"changed": False},
           "gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": nvidia()}},
           "gpufleet.nvidia.driver_transaction": TRANSACTION,
           "ansible.builtin.uri": {"content": KEY}}
REPOSITORY = {"url": MIRROR, "key_content": KEY, "key_fingerprint": PRIMARY}


def test_apt_repository_then_the_transaction_with_what_was_loaded_in_one_task():
    args = {"repository": REPOSITORY,
            "transaction": {"branch": "ltsb", "version": "", "today": "", "catalog": "",
                            "local_facts": {"path": "/etc/ansible/facts.d/gpufleet_driver.fact", "mark_known_good": False}}}
    plugin, calls = action(args, ANSWERS)
    result = plugin.run(task_vars={"ansible_facts": DEBIAN})
    assert [name for name, _a, _c in calls] == [
        "gpufleet.nvidia.driver_apt_repository", "gpufleet.nvidia.gpu_facts", "gpufleet.nvidia.driver_transaction"]
    repo_args = calls[0][1]
    assert repo_args["key"] == KEY and repo_args["keyring_path"] == "/etc/apt/keyrings/gpufleet-nvidia-driver.asc"
    assert MIRROR in repo_args["sources_content"] and "trusted=yes" not in repo_args["sources_content"]
    transaction = calls[2][1]
    # "" means not given; the distribution and the repository come from this task.
    assert "version" not in transaction and "today" not in transaction and "catalog" not in transaction
    assert transaction["distribution"] == "debian12" and transaction["repository"]["url"] == MIRROR
    assert transaction["local_facts"]["loaded_version"] == "580.126.20"
    assert transaction["local_facts"]["driver_state"] == "ok"
    assert result["reboot_required"] is True and result["plan"]["action"] == "upgrade"
    assert result["changed"] is True and result["repository_changed"] is False
    assert result["finished_epoch"] > 0
    # The role's driver_result, whole: its set_fact copies it.
    assert result["driver_result"] == {
        "resolved": {"version": "620.82.01", "branch": "620"}, "action": "upgrade", "previous_version": "580.126.20",
        "steps": [], "reboot_required": True, "loaded_version": "580.126.20", "local_facts": {}, "services": {},
        "finished_epoch": result["finished_epoch"]}


def test_a_key_that_is_not_the_pinned_one_is_refused_before_the_node_is_changed():
    args = {"repository": dict(REPOSITORY, key_fingerprint="EB693B3035CD5710E231E123A4B469963BF863CC")}
    plugin, calls = action(args, ANSWERS)
    with pytest.raises(AnsibleActionFail, match="EB693B3035CD5710E231E123A4B469963BF863CC"):
        plugin.run(task_vars={"ansible_facts": DEBIAN})
    assert calls == []


def test_in_check_mode_the_key_is_still_downloaded_and_the_plan_previews_a_new_repository():
    answers = dict(ANSWERS, **{"gpufleet.nvidia.driver_apt_repository": {"changed": True}})
    args = {"repository": {"url": MIRROR, "key_fingerprint": PRIMARY}}
    plugin, calls = action(args, answers, check_mode=True)
    result = plugin.run(task_vars={"ansible_facts": DEBIAN})
    assert calls[0][0] == "ansible.builtin.uri" and calls[0][2] is False  # read for real
    assert calls[0][1]["url"].startswith(MIRROR)
    assert all(check for name, _a, check in calls[1:])
    assert calls[-1][1]["repository"]["preview"] is True and result["repository_query"]["preview"] is True
    assert plugin._task.check_mode is True


def test_dnf_phases_and_an_unsupported_distribution():
    rhel = {"distribution": "RedHat", "distribution_major_version": "9", "distribution_version": "9.4", "kernel": "5.14"}
    plugin, calls = action({"phases": ["repository"], "repository": REPOSITORY}, ANSWERS)
    result = plugin.run(task_vars={"ansible_facts": rhel})
    # On dnf the role writes the repository's files: the action only checks the key and says where they go.
    assert calls == [] and result["repo"]["package_manager"] == "dnf" and result["key"] == KEY
    assert "plan" not in result
    plugin, calls = action({"repository": REPOSITORY}, ANSWERS)
    with pytest.raises(AnsibleActionFail, match="driver_install: "):
        plugin.run(task_vars={"ansible_facts": dict(DEBIAN, distribution="Gentoo")})
    assert calls == []


def test_the_modules_diffs_are_the_tasks_diff():
    repo_diff = [{"before_header": "/etc/apt/keyrings/gpufleet-nvidia-driver.asc", "before": "", "after": KEY}]
    plan_diff = {"before": "package nvidia-driver-cuda absent\n", "after": "package nvidia-driver-cuda 620.82.01-1\n"}
    answers = dict(ANSWERS, **{"gpufleet.nvidia.driver_apt_repository": {"changed": True, "diff": repo_diff},
                               "gpufleet.nvidia.driver_transaction": dict(TRANSACTION, diff=plan_diff)})
    plugin, _calls = action({"repository": REPOSITORY}, answers)
    result = plugin.run(task_vars={"ansible_facts": DEBIAN})
    assert result["diff"] == repo_diff + [plan_diff]
    assert "diff" not in result["plan"]


def test_the_modules_arguments_do_not_travel_back_in_the_result():
    # A module's result echoes the arguments it was given (invocation): for driver_transaction the
    # GPU list and the repository, which the controller already holds. The task's result drops them.
    echoed = dict(TRANSACTION, invocation={"module_args": {"gpus": [nvidia()] * 8}},
                  installed={"nvidia-driver": "580.126.20"}, installed_after={"nvidia-driver": "620.82.01"},
                  local_facts_previous={"known_good": "580.126.20"})
    answers = dict(ANSWERS, **{"gpufleet.nvidia.driver_transaction": echoed,
                               "gpufleet.nvidia.gpu_facts": {"ansible_facts": {"nvidia": nvidia()},
                                                             "invocation": {"module_args": {"kernel_log": False}}}})
    args = {"repository": REPOSITORY,
            "transaction": {"branch": "ltsb", "local_facts": {"path": "/etc/ansible/facts.d/gpufleet_driver.fact"}}}
    plugin, _calls = action(args, answers)
    result = plugin.run(task_vars={"ansible_facts": DEBIAN})
    assert "invocation" not in result["plan"]
    assert not set(result["plan"]) & {"installed", "installed_after", "local_facts_previous"}
    assert result["plan"]["resolved"] == {"version": "620.82.01", "branch": "620"}
    assert result["ansible_facts"]["nvidia"]["driver"]["loaded_version"] == "580.126.20"
    assert result["reboot_required"] is True


def test_a_caller_that_reads_the_gpus_itself_gets_no_facts_back():
    args = {"repository": REPOSITORY, "facts": False,
            "transaction": {"branch": "ltsb", "local_facts": {"path": "/etc/ansible/facts.d/gpufleet_driver.fact"}}}
    plugin, calls = action(args, ANSWERS)
    result = plugin.run(task_vars={"ansible_facts": DEBIAN})
    # The GPUs are still read: the transaction needs them and the loaded version.
    assert [name for name, _a, _c in calls][1] == "gpufleet.nvidia.gpu_facts"
    assert "ansible_facts" not in result
    assert result["loaded_version"] == "580.126.20" and result["driver_result"]["previous_version"] == "580.126.20"
