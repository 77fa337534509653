# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""simfleet's command line without booting a node: the ssh command line, the status text and the marks it reads."""

import json
import os

from simfleet import cli
from simfleet.node import DRAIN_MARK, ROLLOUT_FLAG, Node, rollout_marks

NODE_ARGV = ["ssh", "-i", "/k", "-p", "2201", "-o", "BatchMode=yes", "root@127.0.0.1"]


def test_ssh_passes_one_quoted_command_to_the_node_shell_as_ssh_does():
    assert cli.ssh_command(NODE_ARGV, ["uname -r; cat /var/lib/gpufleet/drained"]) == NODE_ARGV + [
        "uname -r; cat /var/lib/gpufleet/drained"]


def test_ssh_joins_several_words_with_spaces_as_ssh_does():
    assert cli.ssh_command(NODE_ARGV, ["ls", "-l", "/tmp"]) == NODE_ARGV + ["ls -l /tmp"]
    assert cli.ssh_command(NODE_ARGV, ["--", "test", "-e", "/x"]) == NODE_ARGV + ["test -e /x"]


def test_ssh_without_command_asks_for_a_terminal():
    assert cli.ssh_command(NODE_ARGV, []) == ["ssh", "-t"] + NODE_ARGV[1:]


def test_ssh_words_reach_the_parser_unchanged():
    args = cli._parser().parse_args(["ssh", "node01", "nvidia-smi; dmesg | tail"])
    assert (args.node, args.cmd) == ("node01", ["nvidia-smi; dmesg | tail"])


def test_node_ssh_argv_leaves_a_string_command_to_the_remote_shell():
    node = Node("node01", "h100", 2201, "/fleet", "m")
    assert node.ssh_argv("/k", "a; b")[-1] == "a; b"
    assert node.ssh_argv("/k")[-1] == "root@127.0.0.1"


def _root(tmp_path, version=None, drained=False, flag=None):
    root = tmp_path / "root"
    lib = root / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    if version:
        (lib / ("libnvidia-ml.so." + version)).write_text("")
        os.symlink("libnvidia-ml.so." + version, str(lib / "libnvidia-ml.so.1"))
    if drained:
        (root / DRAIN_MARK).parent.mkdir(parents=True)
        (root / DRAIN_MARK).write_text("")
    if flag is not None:
        (root / ROLLOUT_FLAG).parent.mkdir(parents=True)
        (root / ROLLOUT_FLAG).write_text(flag)
    return str(root)


def test_marks_of_a_node_drained_and_flagged_by_a_failed_rollout(tmp_path):
    flag = json.dumps({"flagged": True, "stage": "wave1", "reason": "GPU lost after reboot", "failed_version": "620.82.01"})
    marks = rollout_marks(_root(tmp_path, "580.126.20", drained=True, flag=flag))
    assert marks == {"driver_version": "580.126.20", "drained": True,
                     "flag": {"flagged": True, "stage": "wave1", "reason": "GPU lost after reboot"}}


def test_marks_of_a_fresh_node_and_of_a_missing_root(tmp_path):
    assert rollout_marks(_root(tmp_path)) == {"driver_version": None, "drained": False, "flag": None}
    assert rollout_marks(str(tmp_path / "absent")) == {"driver_version": None, "drained": False, "flag": None}


def test_a_flag_file_that_is_no_json_object_still_shows_as_a_flag(tmp_path):
    marks = rollout_marks(_root(tmp_path, flag="[1, 2]"))
    assert marks["flag"]["flagged"] is True
    assert marks["flag"]["reason"].startswith("unreadable flag file: ")


def _status(nodes):
    return {"name": "demo", "dir": "/f", "inventory": "/f/inventory.yml",
            "repo": {"state": "running", "port": 2299, "blocked": []}, "nodes": nodes}


def _node(name, **marks):
    node = {"name": name, "class": "h100", "port": 2201, "state": "running", "reboot_hang": False,
            "nspawn_pid": 4242, "boot_id": "b1", "driver_version": None, "drained": False, "flag": None}
    node.update(marks)
    return node


def test_status_text_shows_driver_drain_mark_and_flag():
    text = cli._status_text(_status([
        _node("node01", driver_version="580.126.20"),
        _node("node06", driver_version="580.126.20", drained=True,
              flag={"flagged": True, "stage": "wave1", "reason": "GPU lost after reboot"}),
        _node("node07", state="booting"),
    ]))
    lines = text.splitlines()
    assert lines[3].split() == ["NODE", "CLASS", "PORT", "STATE", "NSPAWN", "DRIVER", "DRAIN", "FLAG", "BOOT", "ID"]
    assert lines[4].split() == ["node01", "h100", "2201", "running", "4242", "580.126.20", "-", "-", "b1"]
    assert lines[5].split() == ["node06", "h100", "2201", "running", "4242", "580.126.20", "drained",
                                "wave1", "GPU", "lost", "after", "reboot", "b1"]
    assert lines[6].split() == ["node07", "h100", "2201", "booting", "4242", "-", "-", "-", "b1"]


def test_a_long_flag_reason_is_cut():
    text = cli._flag_text({"flagged": True, "stage": "canary", "reason": "x" * 100})
    assert len(text) == 48 and text.endswith("...") and text.startswith("canary xxx")
