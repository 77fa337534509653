# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The golden node decides its class's hardware contract (playbooks/rollout.yml, plugin_utils.contract_decision).

A fleet of four H100 nodes of its own, on the baseline 580.126.20: golden node01, canary pool
node02 and node03, wave node04. The simulated R620 reserves 64 MiB more memory per GPU and
620.82.01 lowers the default application clock by 45 MHz (simgpu ``catalog.CONTRACT_OFFSETS``);
node03 is an outlier: with 620.82.01 loaded its GPUs report a maximum SM clock of 1410 MHz
instead of 1980 (simgpu fault ``contract_outlier``). In order:

* a rollout to 620.82.01 that accepts nothing: node01 is upgraded, its two changes are
  unexplained, the rollout stops before the canary stage (the run fails, the report says why in
  its first lines, node02-04 are untouched);
* the same rollout again with the changes accepted (the inventory's ``rollout_contract_accept``,
  as after an approval step): node01 is not upgraded again, the canary pool starts, node02
  matches node01's contract and is upgraded, node03 fails verification with the SM clock named,
  is rolled back to 580.126.20 and stops the rollout; wave node04 is untouched. The target is an
  extra var (``-e driver_version=620.82.01``), which outranks every other variable: the rollback
  must install the last known-good version all the same.

Integration test: real nodes (apt, dpkg, systemd, SSH, reboot); only the GPUs are simulated.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from test_rollout_fleet import INVENTORY_VARS, rollout_fleet  # noqa: E402

pytestmark = pytest.mark.fleet

LAYOUT = "h100,h100,h100,h100"
BASELINE = "580.126.20"
TARGET = "620.82.01"

INVENTORY = INVENTORY_VARS + """\
  children:
    gpu_h100:
      vars:
        gpu_policy_persistence_mode: true
    gpufleet_golden:
      hosts:
        node01:
    gpufleet_canary:
      hosts:
        node02:
        node03:
"""

HOSTS = "node01:node02:node03:node04"


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    yield from rollout_fleet(tmp_path_factory, "rollout-contract", "24800-24899", LAYOUT, inventory=INVENTORY)


def test_an_unexplained_change_stops_after_the_golden_node_and_accepting_it_goes_on(contract):
    rollouts = contract
    rollouts.fleet.fault("node03", "contract_outlier", field="max_sm", value="1410", version=TARGET)
    untouched = dict((node, rollouts.state(node)) for node in ("node02", "node03", "node04"))

    code, log = rollouts.rollout("contract", HOSTS, "-e", "driver_version=%s" % TARGET, "-e", "rollout_contract_accept=")
    assert code == 2, log[-4000:]
    report = rollouts.report("contract")
    assert report["status"] == "stopped"
    assert report["stop_reason"].startswith(
        "contract changes unexplained on golden node node01 (class gpu_h100): default application clock (graphics) "
        "1980 → 1935 MHz on 8 GPUs; reserved memory 480 → 544 MiB on 8 GPUs; accept with "
        "rollout_contract_accept=app_clock_default_graphics_mhz,memory_reserved_mib")
    assert [(s["node"], s["result"]) for s in report["stopped_by"]] == [("node01", "upgraded")]
    golden = report["contract"]["gpu_h100"]
    decided = dict((c["field"], c["decision"]) for c in golden["changes"])
    assert decided["driver_userspace_version"] == "expected" and decided["cuda_driver_version"] == "expected"
    assert decided["memory_reserved_mib"] == "unexplained" and decided["app_clock_default_graphics_mhz"] == "unexplained"
    with open(os.path.join(rollouts.report_dir("contract"), "rollout-report.md")) as handle:
        head = handle.read().split("| stage |")[0]
    assert "Hardware contract, decided by each class's golden node:" in head
    assert "reserved memory 480 → 544 MiB on 8 GPUs (unexplained)" in head
    assert rollouts.loaded("node01") == TARGET
    record = rollouts.record("contract", "node01")
    assert record["contract"]["after"]["gpus"][0]["memory_reserved_mib"] == 544
    # The evidence: a trace of every GPU before and after, beside the report (3 s at 0.5 s: 7 samples).
    for side in ("before", "after"):
        path = record["evidence"]["%s_csv" % side]
        assert path == os.path.join(rollouts.report_dir("contract"), "traces", "node01.%s.csv" % side)
        with open(path) as handle:
            lines = handle.read().splitlines()
        assert lines[0].split(",")[:6] == ["time_s", "gpu", "pci_bus_id", "uuid", "pstate", "sm_clock_mhz"]
        assert len(lines) - 1 == 8 * 7 and record["evidence"]["samples"][side] == 8 * 7
        assert len(set(line.split(",")[2] for line in lines[1:])) == 8
    assert isinstance(record["evidence"]["changes"], list)
    assert "node01, traces before and after: " in head
    for node, state in untouched.items():
        assert rollouts.record("contract", node) is None
        assert rollouts.state(node) == state, node

    # Accepted (the inventory's list), the same rollout goes on from its journal.
    code, log = rollouts.rollout("contract", HOSTS, "-e", "driver_version=%s" % TARGET)
    assert code == 2, log[-4000:]
    assert rollouts.started("contract")["node01"] == 1
    report = rollouts.report("contract")
    assert [c["decision"] for c in report["contract"]["gpu_h100"]["changes"]
            if c["field"] in ("app_clock_default_graphics_mhz", "memory_reserved_mib")] == ["accepted", "accepted"]
    node02 = rollouts.record("contract", "node02")
    assert node02["result"] == "upgraded" and rollouts.loaded("node02") == TARGET
    node03 = rollouts.record("contract", "node03")
    assert node03["result"] == "rolled_back" and "contract_outlier" in node03["flags"], json.dumps(node03)[:2000]
    assert "hardware contract differs from golden node node01: maximum SM clock: golden 1980 MHz, this node 1410 MHz " \
           "on GPUs 0-7" in node03["reason"]
    assert rollouts.loaded("node03") == BASELINE and rollouts.drained("node03")
    assert report["status"] == "stopped" and [s["node"] for s in report["stopped_by"]] == ["node03"]
    assert rollouts.record("contract", "node04") is None and rollouts.loaded("node04") == BASELINE
