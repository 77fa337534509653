"""Run the node_lock module's main() as Ansible does: reading several state files in one task."""

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.nvidia.plugins.modules import node_lock


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            node_lock.main()
    return exit_info.value.code, json.loads(capsys.readouterr().out)


def test_files_are_returned_by_name_with_the_boot_id(tmp_path, capsys):
    (tmp_path / "lock.json").write_text(json.dumps({"rollout_id": "driver-ltsb", "run_id": "ctl-1-1"}))
    (tmp_path / "gpufleet_rollout.fact").write_text("{\"flagged\": tru")
    code, result = run_module({"files": {"lock": str(tmp_path / "lock.json"),
                                         "flag": str(tmp_path / "gpufleet_rollout.fact"),
                                         "snapshot": str(tmp_path / "snapshot.json")}}, capsys)
    assert code == 0 and result["changed"] is False
    assert result["files"]["lock"]["content"]["run_id"] == "ctl-1-1"
    assert result["files"]["flag"]["content"] is None
    assert result["files"]["flag"]["unreadable"].startswith("%s is not JSON" % (tmp_path / "gpufleet_rollout.fact"))
    assert result["files"]["snapshot"]["exists"] is False
    # Linux's boot id: a UUID of 36 characters, the same as the kernel gives now.
    with open("/proc/sys/kernel/random/boot_id") as handle:
        assert result["boot_id"] == handle.read().strip() and len(result["boot_id"]) == 36


def test_path_and_files_together_are_refused(tmp_path, capsys):
    code, result = run_module({"path": str(tmp_path / "lock.json"), "files": {"lock": str(tmp_path / "x")}}, capsys)
    assert code == 1 and "mutually exclusive" in result["msg"]
    code, result = run_module({"state": "release", "run_id": "r", "files": {"lock": str(tmp_path / "x")}}, capsys)
    assert code == 1 and "path" in result["msg"]
