# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpu_policy role and the gpu_policy / gpu_mig modules on the simulated fleet.

The nodes first get a driver the way a site would: the gpufleet.nvidia.driver role, then a reboot
into it. Then, per GPU class, the policy of docs/policy.md is applied and checked through
gpu_facts (what the rest of the collection sees), across a second run, a check run and a reboot
(the boot unit must bring the power limit, persistence, compute mode and MIG devices back).

Run a small fleet for these: ``SIMFLEET_TEST_LAYOUT=h100,l40s``.
"""

from __future__ import annotations

import json
import re

import pytest

from test_driver_role import PLAYBOOK as DRIVER_ROLE_PLAYBOOK

pytestmark = pytest.mark.fleet

# The driver play of the driver role's tests, followed by the reboot into the installed driver.
DRIVER_PLAYBOOK = DRIVER_ROLE_PLAYBOOK + """\
  post_tasks:
    - name: Reboot into the installed driver
      ansible.builtin.reboot:
      when: driver_reboot_required | bool
"""


POLICY_PLAYBOOK = """\
- name: Hold the GPU policy of the class
  hosts: all
  gather_facts: false
  vars:
    gpu_policy_boot_after: [simgpu-boot.service]
  roles:
    - role: gpufleet.nvidia.gpu_policy
"""

FACTS_PLAYBOOK = """\
- name: Read the GPU facts
  hosts: all
  gather_facts: false
  tasks:
    - name: Read the facts through NVML
      gpufleet.nvidia.gpu_facts:
        kernel_log: false
        packages: false
    - name: Keep them on the node for the test to read
      ansible.builtin.copy:
        content: "{{ ansible_facts['nvidia'] | to_json }}"
        dest: /root/policy-test-facts.json
        mode: "0600"
"""

# The class policies of docs/policy.md.
H100_POLICY = {
    "gpu_policy_power_limit_w": 600,
    "gpu_policy_persistence_mode": True,
    "gpu_policy_ecc_mode": True,
    "gpu_policy_compute_mode": "exclusive_process",
    "gpu_policy_mig_layout": [
        {"devices": [0, 1, 2, 3, 4, 5], "mig-enabled": False},
        {"devices": [6, 7], "device-filter": "0x233010DE", "mig-enabled": True,
         "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
    ],
}
L40S_POLICY = {
    "gpu_policy_power_limit_percent": 90,
    "gpu_policy_persistence_mode": True,
    "gpu_policy_ecc_mode": True,
    "gpu_policy_compute_mode": "default",
}

RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def _recap(proc, node):
    for match in RECAP.finditer(proc.stdout):
        if match.group(1) == node:
            return {"changed": int(match.group(3)), "failed": int(match.group(5))}
    return {}


def play(simfleet, tmp_path, node, text, variables=None, *extra):
    playbook = tmp_path / ("play-%d.yml" % abs(hash(text)))
    playbook.write_text(text)
    args = ["-l", node]
    if variables:
        extra_vars = tmp_path / ("vars-%s-%d.json" % (node, abs(hash(json.dumps(variables, sort_keys=True)))))
        extra_vars.write_text(json.dumps(variables))
        args += ["-e", "@%s" % extra_vars]
    proc = simfleet.playbook(str(playbook), *(args + list(extra)), timeout=1200)
    return proc, _recap(proc, node)


def facts(simfleet, tmp_path, node):
    proc = play(simfleet, tmp_path, node, FACTS_PLAYBOOK)[0]
    assert proc.returncode == 0, proc.stdout[-3000:]
    return json.loads(simfleet.run(node, ["cat", "/root/policy-test-facts.json"], check=True).stdout)


def node_file(simfleet, node, path):
    return json.loads(simfleet.run(node, ["cat", path], check=True).stdout)


def mig_layout(gpu):
    seen = {}
    for device in gpu["mig"]["devices"]:
        seen.setdefault(device["gpu_instance_id"], device["profile"])
    layout = {}
    for profile in seen.values():
        layout[profile] = layout.get(profile, 0) + 1
    return layout


@pytest.fixture(scope="module", name="nodes")
def fixture_nodes(simfleet, tmp_path_factory):
    """One fresh node per class used here, with the driver installed and loaded."""
    chosen = {}
    for klass in ("h100", "l40s"):
        found = simfleet.nodes_of(klass)
        if found:
            chosen[klass] = found[0]
    if not chosen:
        pytest.skip("no h100 or l40s node in this fleet (SIMFLEET_TEST_LAYOUT)")
    simfleet.reset(*chosen.values())
    tmp_path = tmp_path_factory.mktemp("driver")
    for node in chosen.values():
        proc, recap = play(simfleet, tmp_path, node, DRIVER_PLAYBOOK, {"driver_branch": "ltsb"})
        assert proc.returncode == 0 and recap.get("failed") == 0, proc.stdout[-4000:]
        check = simfleet.run(node, ["python3", "-c", "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"])
        assert check.returncode == 0, check.stdout + check.stderr
    return chosen


def need(nodes, klass):
    if klass not in nodes:
        pytest.skip("no %s node in this fleet" % klass)
    return nodes[klass]


def test_h100_policy_applies_shows_in_facts_and_holds(simfleet, nodes, tmp_path):
    node = need(nodes, "h100")
    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, H100_POLICY)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert recap["changed"] > 0

    gpus = facts(simfleet, tmp_path, node)["gpus"]
    assert len(gpus) == 8
    assert {(g["power"]["limit_w"], g["power"]["enforced_limit_w"]) for g in gpus} == {(600.0, 600.0)}
    assert {g["persistence_mode"] for g in gpus} == {True}
    assert {g["compute_mode"] for g in gpus} == {"Exclusive_Process"}
    assert [g["mig"]["mode_current"] for g in gpus] == [False] * 6 + [True] * 2
    assert mig_layout(gpus[6]) == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}

    report = node_file(simfleet, node, "/var/lib/gpufleet/gpu_policy/report.json")
    assert report[6]["mig"]["in_effect"] == {"mig_enabled": True,
                                             "mig_devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}
    assert {tuple(g["drift"]) for g in report} == {()}
    prior = node_file(simfleet, node, "/var/lib/gpufleet/gpu_policy/prior.json")
    assert prior[0]["prior"]["power_limit_w"] == 700.0

    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, H100_POLICY)
    assert proc.returncode == 0 and recap["changed"] == 0, proc.stdout[-4000:]

    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, H100_POLICY, "--check", "--diff")
    assert proc.returncode == 0 and recap["changed"] == 0, proc.stdout[-4000:]

    lower = dict(H100_POLICY, gpu_policy_power_limit_w=550)
    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, lower, "--check", "--diff")
    assert proc.returncode == 0 and recap["changed"] > 0, proc.stdout[-4000:]
    assert re.search(r"-\s+\"power_limit_w\": 600\.0", proc.stdout), proc.stdout[-4000:]
    assert re.search(r"\+\s+\"power_limit_w\": 550\.0", proc.stdout), proc.stdout[-4000:]
    assert {g["power"]["limit_w"] for g in facts(simfleet, tmp_path, node)["gpus"]} == {600.0}


def test_h100_reboot_brings_the_policy_back_and_ecc_waits_for_it(simfleet, nodes, tmp_path):
    node = need(nodes, "h100")
    policy = dict(H100_POLICY, gpu_policy_ecc_mode=False)
    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, policy)
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = node_file(simfleet, node, "/var/lib/gpufleet/gpu_policy/report.json")
    assert {g["in_effect"]["ecc_mode"] for g in report} == {True}
    assert {g["pending"].get("ecc_mode") for g in report} == {False}
    assert report[0]["reboot_required"] == ["ECC mode pending: enabled now, disabled after the next reboot"]

    simfleet.reboot(node)
    gpus = facts(simfleet, tmp_path, node)["gpus"]
    assert {g["power"]["limit_w"] for g in gpus} == {600.0}
    assert {g["persistence_mode"] for g in gpus} == {True}
    assert {g["compute_mode"] for g in gpus} == {"Exclusive_Process"}
    assert mig_layout(gpus[6]) == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    assert mig_layout(gpus[7]) == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    assert {(g["ecc"]["mode_current"], g["ecc"]["mode_pending"]) for g in gpus} == {(False, False)}
    boot = node_file(simfleet, node, "/var/lib/gpufleet/gpu_policy/boot-report.json")
    assert boot["ok"] is True and boot["errors"] == []

    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, policy)
    assert proc.returncode == 0 and recap["changed"] == 0, proc.stdout[-4000:]
    report = node_file(simfleet, node, "/var/lib/gpufleet/gpu_policy/report.json")
    assert {g["in_effect"]["ecc_mode"] for g in report} == {False}
    assert {tuple(g["reboot_required"]) for g in report} == {()}


def test_h100_mig_change_with_a_running_process_is_refused_naming_it(simfleet, nodes, tmp_path):
    node = need(nodes, "h100")
    split = dict(H100_POLICY, gpu_policy_mig_layout=[
        {"devices": [0, 1, 2, 3, 4, 5], "mig-enabled": False},
        {"devices": [6, 7], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
    ])
    simfleet.fault(node, "gpu_busy", gpu=7)
    try:
        proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, split)
        assert proc.returncode != 0 and recap["failed"] == 1
        assert re.search(r"MIG change refused: GPU 7 \([0-9a-f:.]+, NVIDIA H100 80GB HBM3\) runs pid \d+ \(python3\)",
                         proc.stdout), proc.stdout[-4000:]
        assert mig_layout(facts(simfleet, tmp_path, node)["gpus"][6]) == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    finally:
        simfleet.fault(node, "clear")  # the only fault set here
    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, split)
    assert proc.returncode == 0, proc.stdout[-4000:]
    gpus = facts(simfleet, tmp_path, node)["gpus"]
    assert mig_layout(gpus[6]) == {"1g.10gb": 7} and mig_layout(gpus[7]) == {"1g.10gb": 7}


def test_l40s_out_of_range_power_limit_is_refused_before_anything_changes(simfleet, nodes, tmp_path):
    node = need(nodes, "l40s")
    before = facts(simfleet, tmp_path, node)["gpus"]
    policy = dict(L40S_POLICY, gpu_policy_power_limit_percent=None, gpu_policy_power_limit_w=400)
    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, policy)
    assert proc.returncode != 0 and recap["failed"] == 1
    assert re.search(r"GPU 0 \([0-9a-f:.]+, NVIDIA L40S\): power limit 400 W is outside its range \[100, 350\] W",
                     proc.stdout), proc.stdout[-4000:]
    after = facts(simfleet, tmp_path, node)["gpus"]
    assert [(g["power"]["limit_w"], g["persistence_mode"]) for g in after] == \
        [(g["power"]["limit_w"], g["persistence_mode"]) for g in before]


def test_l40s_percent_policy_applies_and_has_no_mig(simfleet, nodes, tmp_path):
    node = need(nodes, "l40s")
    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, L40S_POLICY)
    assert proc.returncode == 0, proc.stdout[-4000:]
    gpus = facts(simfleet, tmp_path, node)["gpus"]
    assert {g["power"]["limit_w"] for g in gpus} == {315.0}
    assert {g["persistence_mode"] for g in gpus} == {True}
    report = node_file(simfleet, node, "/var/lib/gpufleet/gpu_policy/report.json")
    assert {g["mig"] is None for g in report} == {True}
    proc, recap = play(simfleet, tmp_path, node, POLICY_PLAYBOOK, L40S_POLICY)
    assert proc.returncode == 0 and recap["changed"] == 0, proc.stdout[-4000:]
