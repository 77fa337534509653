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
    assert result["files"]["flag"]["unreadable"].startswith(
        "unreadable: %s: not JSON" % (tmp_path / "gpufleet_rollout.fact"))
    assert result["files"]["snapshot"]["exists"] is False
    # Linux's boot id: a UUID of 36 characters, the same as the kernel gives now.
    with open("/proc/sys/kernel/random/boot_id") as handle:
        assert result["boot_id"] == handle.read().strip() and len(result["boot_id"]) == 36


def test_path_and_files_together_are_refused(tmp_path, capsys):
    code, result = run_module({"path": str(tmp_path / "lock.json"), "files": {"lock": str(tmp_path / "x")}}, capsys)
    assert code == 1 and "mutually exclusive" in result["msg"]
    code, result = run_module({"state": "release", "run_id": "r", "files": {"lock": str(tmp_path / "x")}}, capsys)
    assert code == 1 and "path" in result["msg"]


def test_a_state_file_is_written_once_and_the_snapshot_closed_before_the_lock_goes(tmp_path, capsys):
    snapshot = tmp_path / "snapshot.json"
    content = {"rollout_id": "driver-ltsb", "run_id": "ctl-1-1", "boot_id": "b1", "facts": {"gpu_count": 8},
               "benchmark": None, "trace": {"csv": "t,sm_mhz\n0,1980\n"}}
    code, result = run_module({"state": "write", "path": str(snapshot), "content": content,
                               "_ansible_check_mode": True}, capsys)
    assert code == 0 and result["changed"] is True and not snapshot.exists()
    code, result = run_module({"state": "write", "path": str(snapshot), "content": content}, capsys)
    assert code == 0 and result["written"] is True and json.loads(snapshot.read_text()) == content
    assert oct(snapshot.stat().st_mode & 0o777) == "0o600"
    code, result = run_module({"state": "write", "path": str(snapshot), "content": content}, capsys)
    assert result["changed"] is False  # the same content: not written again

    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"rollout_id": "driver-ltsb", "run_id": "ctl-1-1"}))
    closed = dict(content, completed=True, result="upgraded")
    code, result = run_module({"state": "release", "path": str(lock), "run_id": "ctl-1-1",
                               "close": {"path": str(snapshot), "content": closed}}, capsys)
    assert code == 0 and result["released"] is True and result["written"] is True and result["changed"] is True
    assert not lock.exists() and json.loads(snapshot.read_text())["completed"] is True
    # Another run's lock stays, but this run's snapshot is still closed.
    lock.write_text(json.dumps({"rollout_id": "driver-ltsb", "run_id": "other-2-2"}))
    code, result = run_module({"state": "release", "path": str(lock), "run_id": "ctl-1-1",
                               "close": {"path": str(snapshot), "content": dict(closed, result="failed")}}, capsys)
    assert code == 0 and result["released"] is False and lock.exists()
    assert json.loads(snapshot.read_text())["result"] == "failed"


def test_a_release_removes_the_flag_of_a_node_that_succeeded_and_an_absent_file_is_no_error(tmp_path, capsys):
    lock, flag = tmp_path / "lock.json", tmp_path / "gpufleet_rollout.fact"
    lock.write_text(json.dumps({"rollout_id": "driver-ltsb", "run_id": "ctl-1-1"}))
    flag.write_text(json.dumps({"flagged": True}))
    code, result = run_module({"state": "release", "path": str(lock), "run_id": "ctl-1-1",
                               "remove": [str(flag), str(tmp_path / "absent.fact")]}, capsys)
    assert code == 0 and result["released"] is True and result["changed"] is True
    assert result["removed"] == [str(flag)] and not flag.exists() and not lock.exists()
    # Nothing to remove and another run's lock: nothing changes.
    lock.write_text(json.dumps({"rollout_id": "driver-ltsb", "run_id": "other-2-2"}))
    code, result = run_module({"state": "release", "path": str(lock), "run_id": "ctl-1-1", "remove": [str(flag)]}, capsys)
    assert code == 0 and result["removed"] == [] and result["changed"] is False and lock.exists()
    # Check mode removes nothing.
    flag.write_text(json.dumps({"flagged": True}))
    code, result = run_module({"state": "release", "path": str(lock), "run_id": "other-2-2", "remove": [str(flag)],
                               "_ansible_check_mode": True}, capsys)
    assert code == 0 and flag.exists()


def test_a_snapshot_is_closed_on_the_node_with_only_the_keys_that_change(tmp_path, capsys):
    snapshot, lock = tmp_path / "snapshot.json", tmp_path / "lock.json"
    saved = {"rollout_id": "driver-ltsb", "boot_id": "b1", "facts": {"gpu_count": 8}, "trace": {"csv": "t\n0\n"}}
    snapshot.write_text(json.dumps(saved))
    lock.write_text(json.dumps({"rollout_id": "driver-ltsb", "run_id": "ctl-1-1"}))
    code, result = run_module({"state": "release", "path": str(lock), "run_id": "ctl-1-1",
                               "close": {"path": str(snapshot), "update": {"completed": True, "result": "upgraded"}}},
                              capsys)
    assert code == 0 and result["released"] is True and result["written"] is True
    assert json.loads(snapshot.read_text()) == dict(saved, completed=True, result="upgraded")
    # A snapshot cut short (not JSON): the fallback content with the keys, not the broken file.
    snapshot.write_text("{\"rollout_id\": \"dri")
    code, result = run_module({"state": "release", "path": str(lock), "run_id": "ctl-1-1",
                               "close": {"path": str(snapshot), "content": {"facts": None, "local_facts": {}},
                                         "update": {"completed": True, "result": "rolled_back"}}}, capsys)
    assert code == 0 and result["written"] is True
    assert json.loads(snapshot.read_text()) == {"facts": None, "local_facts": {}, "completed": True, "result": "rolled_back"}
    # A missing snapshot and no fallback: the keys alone.
    snapshot.unlink()
    code, result = run_module({"state": "release", "path": str(lock), "run_id": "ctl-1-1",
                               "close": {"path": str(snapshot), "update": {"completed": True, "result": "failed"}}}, capsys)
    assert json.loads(snapshot.read_text()) == {"completed": True, "result": "failed"}
    # Neither content nor update: refused.
    code, result = run_module({"state": "release", "path": str(lock), "run_id": "ctl-1-1",
                               "close": {"path": str(snapshot)}}, capsys)
    assert code == 1 and "content" in result["msg"] and "update" in result["msg"]
