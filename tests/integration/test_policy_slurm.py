# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A MIG layout change on a Slurm node, against a real Slurm cluster (field case 46).

Integration test on the simulated fleet: slurmctld on the host, slurmd on the node (Debian's
slurm-wlm 22.05), real ``sbatch`` jobs; the node's gres.conf is written at each start of slurmd from
its simulated GPUs, MIG devices included (what ``AutoDetect=nvml`` finds on a real node), so the
counts Slurm registers, and what slurmctld does when they differ from slurm.conf, are Slurm's own.

One H100 node (8 GPUs, ``Gres=gpu:8``) on the baseline driver, ``node_upgrade_drain: slurm``. In order:

* the gpu_policy role asks for MIG on GPUs 6 and 7 (two MIG devices each: 10 gres/gpu) while a job
  runs on the node: the node is drained, the layout waits for the job's end, is applied, and the node
  stays drained because slurm.conf still configures 8 (the reason names both counts; the run fails
  with what to do);
* the site configures ``Gres=gpu:10`` and restarts slurmctld; the same policy run again changes no MIG
  device, restarts slurmd, sees the registration accepted and resumes the node: a job asking for 10
  GPUs runs there;
* without the role's coordination (``gpu_policy_scheduler: none``) a layout with fewer MIG devices (8)
  and a restart of slurmd gives what case 46 reports: slurmctld sets the node INVAL and drains it,
  ``gres/gpu count reported lower than configured (8 < 10)``, which the collection's scheduler reader
  takes for Slurm's own GPU-count drain.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SIMFLEET_DIR = os.path.join(REPO, "tests", "simfleet")
if SIMFLEET_DIR not in sys.path:
    sys.path.append(SIMFLEET_DIR)

from test_rollout_fleet import rollout_fleet, wait_for  # noqa: E402
from test_rollout_slurm import INVENTORY, SlurmRollouts, release  # noqa: E402
from simfleet.testing import session_fleet_name  # noqa: E402

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import scheduler_state  # noqa: E402

pytestmark = pytest.mark.fleet

WHOLE = [0, 1, 2, 3, 4, 5]
POLICY = """\
- name: Hold the MIG layout of the class
  hosts: node01
  gather_facts: false
  vars:
    gpu_policy_boot_after: [simgpu-boot.service]
    gpu_policy_drain_poll_s: 2
    gpu_policy_mig_layout:
      - {devices: %(whole)s, mig-enabled: false}
      - {devices: [6, 7], mig-enabled: true, mig-devices: %(mig)s}
  roles:
    - role: gpufleet.nvidia.gpu_policy
"""
TEN = {"3g.40gb": 1, "1g.10gb": 1}     # 6 whole GPUs + 2 x 2 MIG devices = 10 gres/gpu
EIGHT = {"3g.40gb": 1}                 # 6 + 2 x 1 = 8


def _playbook(handle, name, mig):
    path = os.path.join(handle.dir, name)
    with open(path, "w") as out:
        out.write(POLICY % {"whole": json.dumps(WHOLE), "mig": json.dumps(mig)})
    return path


def _mig_devices(handle, node, index):
    gpu = handle.fleet.state(node)["gpus"][index]
    if not gpu["mig"].get("current"):
        return 0
    return sum(len(inst["compute_instances"]) for inst in gpu["mig"]["instances"])


@pytest.fixture(scope="module")
def policy_slurm(tmp_path_factory):
    yield from rollout_fleet(tmp_path_factory, session_fleet_name("pytest-policy-slurm"), os.environ.get("POLICY_SLURM_PORTS"),
                             "h100", slurm=True, handle_class=SlurmRollouts, inventory=INVENTORY, reboot_timeout_s=180)


def test_a_mig_change_on_a_slurm_node_waits_for_its_job_and_resumes_it_only_with_the_new_count(policy_slurm):
    handle = policy_slurm
    assert handle.slurm_node("node01")["state"] == "IDLE"
    job = handle.sbatch("node01", "i=0; while [ ! -e /root/go ] && [ $i -lt 600 ]; do sleep 1; i=$((i+1)); done")
    wait_for(lambda: handle.job_state(job) == "RUNNING", 60, "job %s running on node01" % job)

    proc, log = handle.start(_playbook(handle, "ten.yml", TEN))
    wait_for(lambda: handle.slurm_node("node01")["summary"] == "draining" or proc.poll() is not None, 300,
             "the policy to drain node01")
    time.sleep(6)
    # Drained while the job runs: no MIG change yet.
    assert handle.slurm_node("node01")["summary"] == "draining" and proc.poll() is None
    assert (_mig_devices(handle, "node01", 6), _mig_devices(handle, "node01", 7)) == (0, 0)
    release(handle, "node01", "/root/go")
    proc.wait(timeout=600)
    with open(log) as out:
        text = out.read()
    assert proc.returncode != 0, text[-3000:]
    assert "the MIG layout gives node node01 10 gres/gpu" in text and "configures Gres=gpu:8" in text, text[-3000:]
    assert (_mig_devices(handle, "node01", 6), _mig_devices(handle, "node01", 7)) == (2, 2)
    node = handle.slurm_node("node01")
    assert node["drain"] and node["reason"] == (
        "gpufleet gpu_policy: MIG layout change: the layout gives gres/gpu 10, slurm.conf configures 8"), node

    # The site configures the new count; the same policy again resumes the node.
    handle.fleet.set_slurm_gpus("node01", 10)
    assert handle.fleet.slurm_nodes()["node01"]["Gres"] == "gpu:10"
    assert handle.slurm_node("node01")["drain"]
    code, text = handle.run(_playbook(handle, "ten.yml", TEN))
    assert code == 0, text[-3000:]
    # Right after State=RESUME scontrol shows IDLE+NOT_RESPONDING until slurmctld's next ping of the node
    # (about a second, tests/simfleet/README.md).
    wait_for(lambda: handle.slurm_node("node01")["state"] == "IDLE", 30, "node01 IDLE after the resume")
    node = handle.slurm_node("node01")
    assert node["state"] == "IDLE" and not node["drain"], node
    ten = handle.fleet.slurm(["sbatch", "--parsable", "--nodelist=node01", "--chdir=/root", "--gres=gpu:10",
                              "--output=/root/ten-%j.out", "--wrap", "echo $CUDA_VISIBLE_DEVICES"], check=True)
    job10 = ten.stdout.strip().split(";")[0]
    path = os.path.join(handle.fleet.root_of("node01"), "root", "ten-%s.out" % job10)
    wait_for(lambda: os.path.exists(path) and os.path.getsize(path) > 0, 60, "the 10-GPU job's output")
    with open(path) as out:
        assert len(out.read().strip().split(",")) == 10


def test_without_coordination_fewer_mig_devices_make_slurm_set_the_node_inval(policy_slurm):
    handle = policy_slurm
    code, text = handle.run(_playbook(handle, "eight.yml", EIGHT), "-e", "gpu_policy_scheduler=none")
    assert code == 0, text[-3000:]
    assert (_mig_devices(handle, "node01", 6), _mig_devices(handle, "node01", 7)) == (1, 1)
    handle.fleet.run("node01", ["systemctl", "restart", "slurmd.service"], check=True)

    def inval():
        return "INVALID_REG" in handle.slurm_node("node01")["state"] or "INVAL" in handle.slurm_node("node01")["state"]

    wait_for(inval, 60, "slurmctld to refuse node01's registration")
    node = handle.slurm_node("node01")
    assert node["drain"] and node["reason"] == "gres/gpu count reported lower than configured (8 < 10)", node
    shown = handle.fleet.slurm(["scontrol", "show", "node", "-o", "node01"], check=True).stdout
    sched = scheduler_state.drain_state("slurm", shown, "node01")
    assert sched["drain_kind"] == "gpu_count" and sched["gpu_count"] == {"reported": 8, "configured": 10}
    assert sched["resume_blocked"] is True
