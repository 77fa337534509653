# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A MIG layout change on a Slurm node: the gres/gpu count it gives and whether Slurm may take the
node back (plugin_utils.slurm_mig; field case 46). The slurmctld lines are those of the case's
source, ComputeCanada/puppet-magic_castle issue 361, and of the simulated fleet's Slurm 22.05."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.scheduler_state import parse_slurm_show_node
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.slurm_mig import (
    check_registration,
    configured_gpus,
    slurm_gpu_count,
)

CASE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "cases",
                    "46-slurm-mig-count-change-gres-inval-drain", "input-slurmctld.log")

SHOW = ("NodeName=node01 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=1 Gres=%s NodeAddr=127.0.0.1 "
        "NodeHostName=node01 Port=23503 State=%s Partitions=gpu,gpu_h100 BootTime=2026-12-07T11:01:28")


def _gpu(index, mig=None):
    """A GPU of gpu_facts: whole (mig None), or in MIG mode with MIG devices of these profiles."""
    return {"index": index, "pci_bus_id": "00000000:%02X:00.0" % (0x18 + index),
            "mig": {"mode_current": mig is not None, "mode_pending": mig is not None,
                    "devices": [{"profile": p} for p in (mig or [])]}}


H100_TEN = [_gpu(i) for i in range(6)] + [_gpu(6, ["3g.40gb", "1g.10gb"]), _gpu(7, ["3g.40gb", "1g.10gb"])]


@pytest.mark.parametrize("gres, count", [
    ("gpu:8", 8), ("gpu:h100:6,gpu:3g.40gb:2", 8), ("gpu:4(S:0,1),nic:1", 4), ("gpu:a100:4(S:0-1)", 4),
    ("gpu", 1), ("nic:2", 0), ("(null)", 0), (None, 0), ("gpu:a:b:c", None),
])
def test_the_configured_gpu_count_is_read_from_gres(gres, count):
    assert configured_gpus(gres) == count


def test_slurm_counts_whole_gpus_and_each_mig_device():
    counted = slurm_gpu_count(H100_TEN)
    assert counted == {"count": 10, "whole_gpus": 6, "mig_devices": 4,
                       "by_type": {"gpu": 6, "3g.40gb": 2, "1g.10gb": 2}, "unknown": []}
    # MIG mode on without MIG devices: nothing for Slurm.
    assert slurm_gpu_count([_gpu(0), _gpu(1, [])])["count"] == 1


def test_a_new_layout_slurm_conf_does_not_configure_keeps_the_node_drained():
    check = check_registration(SHOW % ("gpu:8", "IDLE+DRAIN") + " Reason=gpufleet gpu_policy: MIG layout change "
                               "[root@2026-12-07T11:10:00]", "node01", H100_TEN)
    assert (check["found"], check["configured"], check["match"], check["ready"]) == (10, 8, False, False)
    assert "Slurm would ignore the extra MIG devices" in check["message"]
    assert "Set the node's Gres=gpu:10 in slurm.conf" in check["message"]
    fewer = check_registration(SHOW % ("gpu:4", "IDLE+DRAIN"), "node01", [_gpu(0, ["2g.20gb"] * 3)])
    assert (fewer["found"], fewer["configured"], fewer["ready"]) == (3, 4, False)
    assert "Slurm would set the node INVAL and drain it" in fewer["message"]


def test_the_node_is_ready_once_slurm_configures_and_accepts_the_count():
    before = check_registration(SHOW % ("gpu:10", "IDLE+DRAIN"), "node01", H100_TEN)
    assert before["match"] and before["ready"] and not before["invalid"]
    refused = check_registration(SHOW % ("gpu:10", "IDLE+DRAIN+INVALID_REG") + " Reason=gres/gpu count reported lower "
                                 "than configured (8 < 10) [slurm@2026-12-07T11:12:00]", "node01", H100_TEN, True)
    assert refused["match"] and refused["invalid"] and not refused["ready"]
    assert refused["drain_kind"] == "gpu_count" and "refused node node01's registration" in refused["message"]
    with pytest.raises(ValueError, match="not for 'node02'"):
        check_registration(SHOW % ("gpu:10", "IDLE"), "node02", H100_TEN)


def test_case_46_the_drain_slurmctld_made_for_the_count_is_its_own():
    with open(CASE, encoding="utf-8") as handle:
        log = handle.read()
    assert "gres/gpu count reported lower than configured (3 < 4)" in log
    # slurmctld sets its reasons as SlurmUser: slurm on most sites, root where slurm.conf leaves it out.
    for user in ("slurm", "root"):
        node = parse_slurm_show_node(SHOW % ("gpu:4", "IDLE+DRAIN+INVALID_REG") + " Reason=gres/gpu count reported "
                                     "lower than configured (3 < 4) [%s@2024-05-23T10:00:00]" % user)
        assert node["drain_kind"] == "gpu_count" and node["gpu_count"] == {"reported": 3, "configured": 4}
    other = parse_slurm_show_node(SHOW % ("gpu:4", "IDLE+DRAIN") + " Reason=reseat GPU 3 [root@2024-05-23T10:00:00]")
    assert other["drain_kind"] == "operator"


def test_a_gres_it_cannot_read_keeps_the_node_drained_and_says_so():
    check = check_registration(SHOW % ("gpu:a:b:c", "IDLE+DRAIN"), "node01", H100_TEN)
    assert check["configured"] is None and check["match"] is False and check["ready"] is False
    assert "Gres=gpu:a:b:c for node node01 cannot be read as a gres/gpu count" in check["message"]
    # A GPU without MIG (mig mode not read, e.g. an L40S) is one whole GPU.
    assert slurm_gpu_count([{"index": 0, "mig": {"mode_current": None, "devices": []}}])["count"] == 1
    with pytest.raises(ValueError):
        check_registration("no such node", "node01", H100_TEN)
