# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's scheduler state and who drained it (plugin_utils.scheduler_state)."""

from __future__ import annotations

import os
import re
import time

import pytest

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.scheduler_state import (
    MAX_HOSTLIST,
    describe_drain,
    drain_state,
    drained_by_others,
    expand_hostlist,
    parse_slurm_show_node,
    slurm_drain_estimates,
    slurm_time_s,
)

# Shaped as Slurm 22.05's scontrol show node -o (fields abridged; Reason last, with spaces).
IDLE = ("NodeName=node01 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 Gres=gpu:8 NodeAddr=127.0.0.1 "
        "NodeHostName=node01 Port=24510 RealMemory=1000 State=IDLE ThreadsPerCore=1 Partitions=gpu_h100,all "
        "BootTime=2026-12-01T10:00:00 SlurmdStartTime=2026-12-01T10:00:05")
DRAINING = IDLE.replace("CPUAlloc=0", "CPUAlloc=1").replace("State=IDLE", "State=MIXED+DRAIN") + \
    " Reason=gpufleet driver-ltsb: driver rollout [root@2026-12-01T10:05:00]"
DRAINED_BY_OPERATOR = IDLE.replace("State=IDLE", "State=IDLE+DRAIN") + " Reason=bad DIMM, ticket 4711 [alice@2026-11-30T08:00:00]"


def test_idle_node():
    node = parse_slurm_show_node(IDLE)
    assert node["name"] == "node01" and node["state"] == "IDLE" and node["flags"] == []
    assert node["out_of_service"] is False and node["drained"] is False and node["draining"] is False
    assert node["reason"] is None and node["gres"] == "gpu:8" and node["partitions"] == ["gpu_h100", "all"]


def test_draining_while_a_job_runs_then_drained():
    node = parse_slurm_show_node(DRAINING)
    assert node["state"] == "MIXED" and node["flags"] == ["DRAIN"]
    assert node["draining"] is True and node["drained"] is False and node["out_of_service"] is True
    assert node["reason"] == "gpufleet driver-ltsb: driver rollout" and node["reason_by"] == "root@2026-12-01T10:05:00"
    done = parse_slurm_show_node(DRAINING.replace("State=MIXED+DRAIN", "State=IDLE+DRAIN"))
    assert done["drained"] is True and done["draining"] is False


def test_reason_with_spaces_and_down_nodes():
    node = parse_slurm_show_node(DRAINED_BY_OPERATOR)
    assert node["reason"] == "bad DIMM, ticket 4711" and node["reason_by"] == "alice@2026-11-30T08:00:00"
    down = parse_slurm_show_node(IDLE.replace("State=IDLE", "State=DOWN+NOT_RESPONDING") + " Reason=Not responding [slurm@t]")
    assert down["out_of_service"] is True and down["drained"] is True and down["flags"] == ["NOT_RESPONDING"]


def test_not_a_node_line_is_an_error():
    with pytest.raises(ValueError, match="not a line of scontrol show node -o"):
        parse_slurm_show_node("Node node99 not found")


def test_drain_state_per_backend_and_who_drained():
    assert drain_state("slurm", DRAINED_BY_OPERATOR)["out_of_service"] is True
    expected = {"backend": "kubernetes", "known": True, "out_of_service": True, "draining": False, "reason": "cordoned",
                "reason_by": None, "state": "cordoned", "drain_kind": "operator", "gpu_count": None,
                "resume_blocked": False}
    assert drain_state("kubernetes", "true\n") == expected
    assert drain_state("kubernetes", "")["out_of_service"] is False
    assert drain_state("command", None)["known"] is False and drain_state("none", "")["out_of_service"] is None
    with pytest.raises(ValueError, match="unknown drain backend 'pbs'"):
        drain_state("pbs", "")
    operator = drain_state("slurm", DRAINED_BY_OPERATOR)
    assert drained_by_others(operator, {}) is True
    assert drained_by_others(operator, {"rollout_id": "driver-ltsb", "run_id": "r1"}) is False  # ours, from a failed run
    assert drained_by_others(drain_state("slurm", IDLE), {}) is False
    assert drained_by_others(drain_state("command", None), {}) is False


def test_slurm_reboot_reads_the_node_as_slurm_does():
    assert drain_state("slurm_reboot", DRAINING) == dict(drain_state("slurm", DRAINING), backend="slurm_reboot")
    assert drain_state("slurm_reboot", DRAINING)["draining"] is True


@pytest.mark.parametrize("text, names", [
    ("node01", ["node01"]),
    ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
    ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
    ("r[1-2]n[8-9]", ["r1n8", "r1n9", "r2n8", "r2n9"]),
    ("a,b[2],c", ["a", "b2", "c"]),
    ("", []),
])
def test_expand_hostlist(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text, words", [
    ("gpu[01-03", "unbalanced ["), ("gpu01]", "unbalanced ]"), ("gpu[3-1]", "bad range"),
    ("gpu[a-b]", "bad range"), ("gpu[0-%d]" % MAX_HOSTLIST, "names more than"),
])
def test_expand_hostlist_refuses_what_slurm_does_not_write(text, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        expand_hostlist(text)


@pytest.mark.parametrize("text, seconds", [
    ("1-02:03:04", 93784.0), ("2:03:04", 7384.0), ("3:04", 184.0), ("45", 2700.0), ("1-02", 93600.0),
    ("UNLIMITED", None), ("NOT_SET", None), ("INVALID", None), ("", None),
])
def test_slurm_time(text, seconds):
    assert slurm_time_s(text) == seconds


def test_drain_estimates_take_the_longest_job_and_skip_unlimited_ones():
    text = ("node[01-02]|1:00:00\n"      # one job on two nodes
            "node02|2:00:00\n"           # a longer one on node02
            "node03|UNLIMITED\n"         # no limit: its drain cannot be estimated
            "node03|5:00\n"
            "node[04|1:00\n"             # not a hostlist: skipped
            "garbage\n")
    assert slurm_drain_estimates(text) == {"node01": 3600.0, "node02": 7200.0}


CASE_41 = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "cases",
                       "41-slurm-drained-by-slurm-gres-gpu-count-lower")


def _case_41(name):
    with open(os.path.join(CASE_41, name), "r", encoding="utf-8") as handle:
        return handle.read()


def test_case_41_slurm_drained_the_node_itself_for_its_gpu_count():
    text = _case_41("input-scontrol-show-node.txt")
    one_line = " ".join(line.strip() for line in text.splitlines() if line.strip())   # as -o prints it
    for answer in (text, one_line):
        node = parse_slurm_show_node(answer, "yigou-dev-102-68")
        assert node["name"] == "yigou-dev-102-68" and node["state"] == "IDLE" and node["flags"] == ["DRAIN"]
        assert node["drained"] is True and node["draining"] is False and node["out_of_service"] is True
        assert node["reason"] == "gres/gpu count reported lower than configured (0 < 1)"
        assert node["reason_by"] == "slurm@2024-12-19T11:03:34"
        assert (node["reason_user"], node["reason_time"]) == ("slurm", "2024-12-19T11:03:34")
        assert node["gres"] == "gpu:nvidia-rtx-3090:1" and node["gpus_configured"] == 1
        assert node["partitions"] == ["compute100"]
        assert node["drain_kind"] == "gpu_count" and node["gpu_count"] == {"reported": 0, "configured": 1}
    sched = drain_state("slurm", one_line, "yigou-dev-102-68")
    assert sched["drain_kind"] == "gpu_count" and sched["resume_blocked"] is True and sched["state"] == "IDLE+DRAIN"
    assert describe_drain(sched).startswith(
        "drained by Slurm itself: Slurm sees 0 of 1 configured GPUs (gres/gpu count reported lower than configured "
        "(0 < 1), slurm@2024-12-19T11:03:34): a GPU or driver fault, not a maintenance hold")
    # The description's 8-GPU node, the same reason.
    reason = _case_41("input-195-description.txt").strip()
    eight = parse_slurm_show_node("NodeName=ip-10-1-2-3 State=IDLE+DRAIN CfgTRES=cpu=96,gres/gpu=8 %s [slurm@2024-03-09T10:00:00]" % reason)
    assert eight["gpu_count"] == {"reported": 0, "configured": 8} and eight["gpus_configured"] == 8


def test_the_same_reason_set_by_a_person_is_an_operator_hold_and_other_slurm_reasons_are_the_schedulers():
    by_alice = parse_slurm_show_node(IDLE.replace("State=IDLE", "State=IDLE+DRAIN")
                                     + " Reason=gres/gpu count reported lower than configured (0 < 8) [alice@t]")
    assert by_alice["drain_kind"] == "operator" and by_alice["gpu_count"] is None
    assert parse_slurm_show_node(DRAINED_BY_OPERATOR)["drain_kind"] == "operator"
    down = parse_slurm_show_node(IDLE.replace("State=IDLE", "State=DOWN") + " Reason=Not responding [slurm@t]")
    assert down["drain_kind"] == "scheduler"
    assert parse_slurm_show_node(IDLE)["drain_kind"] is None


def test_an_answer_for_another_node_is_refused_and_fields_after_the_reason_are_not_the_reason():
    with pytest.raises(ValueError, match="answered for node 'node01', not for 'node02', the node asked for"):
        parse_slurm_show_node(IDLE, "node02")
    node = parse_slurm_show_node(DRAINED_BY_OPERATOR.replace(" [alice@2026-11-30T08:00:00]", "")
                                 + " Comment=rack4 ResumeAfterTime=None")
    assert node["reason"] == "bad DIMM, ticket 4711" and node["reason_by"] is None
    # A reason that holds "State=IDLE" after its stamp does not change the node's state.
    hostile = parse_slurm_show_node(DRAINED_BY_OPERATOR + " State=IDLE")
    assert hostile["state"] == "IDLE" and hostile["flags"] == ["DRAIN"] and hostile["out_of_service"] is True
    own_text = parse_slurm_show_node(IDLE.replace("State=IDLE", "State=IDLE+DRAIN") + " Reason=see a=b in the log")
    assert own_text["reason"] == "see a=b in the log"


def test_two_bracket_groups_are_counted_before_they_are_built():
    started = time.monotonic()
    with pytest.raises(ValueError, match="names more than 100000 nodes"):
        expand_hostlist("gpu[0-99999][0-99999]")
    with pytest.raises(ValueError, match="names more than 100000 nodes"):
        slurm_drain_estimates("x") or expand_hostlist("a[1-400]b[1-400]")
    assert time.monotonic() - started < 1.0
    assert slurm_drain_estimates("gpu[0-99999][0-99999]|1:00:00\ngpu01|2:00\n") == {"gpu01": 120.0}
    assert len(expand_hostlist("a[1-300]b[1-300]")) == 90000


def test_a_restarted_slurmd_is_told_by_its_start_time_and_responding():
    # What the roles wait for after a restart of slurmd: slurmctld reaches it, and its start time changed.
    assert drain_state("slurm", IDLE)["responding"] is True
    assert drain_state("slurm", IDLE)["slurmd_start_time"] == "2026-12-01T10:00:05"
    assert drain_state("slurm", IDLE.replace("State=IDLE", "State=IDLE*"))["responding"] is False
    assert drain_state("slurm", IDLE.replace("State=IDLE", "State=IDLE+DRAIN+NOT_RESPONDING"))["responding"] is False
    rebooting = drain_state("slurm", IDLE.replace("State=IDLE", "State=DOWN+REBOOT_ISSUED"))
    assert rebooting["reboot_issued"] is True and rebooting["responding"] is True
    assert drain_state("slurm", IDLE.replace(" SlurmdStartTime=2026-12-01T10:00:05", ""))["slurmd_start_time"] is None


def test_busy_nodes_from_squeue_name_every_node_of_a_running_job():
    from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import scheduler_state as ss  # noqa: E402

    assert ss.slurm_busy_nodes("node[01-03]|10:00\nnode07|UNLIMITED\n\n") == {"node01", "node02", "node03", "node07"}
    assert ss.slurm_busy_nodes("") == set()
    assert ss.slurm_busy_nodes("node01 10:00") is None
