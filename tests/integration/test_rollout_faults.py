# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rest of the fault matrix: every fault kind at every stage (playbooks/rollout.yml).

test_rollout_fleet.py injects each of the five fault kinds once (build failure in a wave, GPU
lost at golden, Xid storm in the canary pool, version mismatch at golden, hung reboot at
golden). This module injects the ten other pairs of kind and stage, ten rollouts at once on a
fleet of its own: node01-node10 each take one fault, node11 is the node all ten rollouts would
reach next and none may touch.

The stage of the faulty node is chosen per rollout with rollout_golden_group /
rollout_canary_group (a host name is a pattern): golden = the node is the golden node; canary =
no golden node, the node is the canary pool; wave = neither, the node is the first wave batch.
In each case node11 is the later stage (or wave batch) that must not start.
"""

from __future__ import annotations

import json

import pytest

from test_rollout_fleet import BASELINE, INVENTORY_VARS, assert_on, assert_recovered, rollout_fleet, wait_for

pytestmark = pytest.mark.fleet

LAYOUT = "h100,a100,h100,l40s,h100,a100,h100,l40s,h100,a100,h100"
SENTINEL = "node11"
TARGET = "620.82.01"

# (rollout id, node, stage, fault kind, fault arguments)
MATRIX = [
    ("m-build-golden", "node01", "golden", "build_fail", {"version": TARGET}),
    ("m-build-canary", "node02", "canary", "build_fail", {"version": TARGET}),
    ("m-lost-canary", "node03", "canary", "gpu_lost", {"gpu": "3"}),
    ("m-lost-wave", "node04", "wave", "gpu_lost", {"gpu": "1"}),
    ("m-xid-golden", "node05", "golden", "xid_storm", {"xid": "48", "count": "5", "gpu": "0"}),
    ("m-xid-wave", "node06", "wave", "xid_storm", {"xid": "95", "count": "3", "gpu": "2"}),
    ("m-hang-canary", "node07", "canary", "reboot_hang", {}),
    ("m-hang-wave", "node08", "wave", "reboot_hang", {}),
    ("m-mismatch-canary", "node09", "canary", "version_mismatch", {}),
    ("m-mismatch-wave", "node10", "wave", "version_mismatch", {}),
]

SOAK_S = 60


def stage_vars(node, stage):
    """Golden and canary: zero tolerance, node11 (a wave node) waits for the stage. Wave: both nodes
    in one class (its one slot) with a failure budget of 0, each wave node soaking after its upgrade."""
    golden = node if stage == "golden" else "none"
    canary = node if stage == "canary" else "none"
    # The sentinel is a wave node of every rollout at once (allowed concurrent): drained ahead,
    # one rollout would lock it and the others be refused there. One admission keeps it unreached;
    # a stop's release of the nodes drained ahead is tested in test_rollout_scale.py.
    out = ["-e", "rollout_golden_group=%s" % golden, "-e", "rollout_canary_group=%s" % canary,
           "-e", "rollout_soak_s=%d" % SOAK_S, "-e", "rollout_drain_ahead=false"]
    if stage == "wave":
        out += ["-e", "rollout_wave_soak_s=%d" % SOAK_S, "-e", "rollout_class_prefix=none_",
                "-e", "rollout_failure_budget=0"]
    return out


@pytest.fixture(scope="module")
def matrix_fleet(tmp_path_factory):
    # Ten rollouts share two cores: a normal reboot may take longer than the first module's 90 s.
    yield from rollout_fleet(tmp_path_factory, "rollout-faults", "24400-24499", LAYOUT,
                             inventory=INVENTORY_VARS, reboot_timeout_s=180)


def test_every_fault_kind_at_every_stage_stops_the_rollout_at_that_node(matrix_fleet):
    rollouts = matrix_fleet
    fleet = rollouts.fleet
    untouched = rollouts.state(SENTINEL)
    for _rid, node, _stage, kind, args in MATRIX:
        if kind != "xid_storm":
            fleet.fault(node, kind, **args)
    procs = {}
    for rid, node, stage, _kind, _args in MATRIX:
        procs[rid] = rollouts.rollout(rid, "%s:%s" % (node, SENTINEL), *stage_vars(node, stage), start=True,
                                      concurrent=True)[0]
    # The Xid storms come during the soak that follows a verified upgrade.
    for rid, node, _stage, kind, args in MATRIX:
        if kind == "xid_storm":
            wait_for(lambda rid=rid, node=node: (rollouts.record(rid, node) or {}).get("result") == "upgraded", 1500,
                     "%s to be upgraded" % node)
            fleet.fault(node, kind, **args)
    codes = dict((rid, proc.wait(timeout=1800)) for rid, proc in procs.items())
    try:
        for rid, node, stage, kind, args in MATRIX:
            # The failed host stops the rollout (2); a hung node may also count as unreachable (4).
            assert codes[rid] == 2 or (kind == "reboot_hang" and codes[rid] == 4), (rid, codes[rid])
            report = rollouts.report(rid)
            assert report["summary"]["not_started"] == 1, (rid, report["summary"])
            assert rollouts.record(rid, SENTINEL) is None, rid
            if kind == "reboot_hang":
                record = rollouts.record(rid, node)
                assert record["result"] == "flagged" and "does not answer" in record["reason"], record
                assert rollouts.drained(node) and report["status"] == "stopped"
                continue
            record = assert_recovered(rollouts, rid, node, BASELINE)
            assert record["stage"] == {"wave": "waves"}.get(stage, stage), (rid, record["stage"])
            if kind == "build_fail":
                assert record["flags"] == ["transaction_failed"] and "apt-get failed" in record["reason"], record
                assert record["result"] == "rolled_back", record
                assert_on(rollouts, node, BASELINE)
            elif kind == "gpu_lost":
                assert {"gpu_unreadable", "gpu_count_changed"} & set(record["flags"]), record
            elif kind == "xid_storm":
                assert "new fatal Xid during the soak: Xid %s" % args["xid"] in record["reason"], record
                assert record["result"] == "rolled_back", record
                assert_on(rollouts, node, BASELINE)
                local = json.loads(rollouts.sh(node, "cat /etc/ansible/facts.d/gpufleet_driver.fact"))
                assert local["last_known_good"]["version"] == BASELINE
            elif kind == "version_mismatch":
                assert "version_not_loaded" in record["flags"], record
        assert rollouts.state(SENTINEL) == untouched
    finally:
        for _rid, node, _stage, kind, _args in MATRIX:
            if kind == "reboot_hang":
                fleet.fault(node, "clear")
