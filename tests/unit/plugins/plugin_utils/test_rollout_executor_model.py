# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulation's executors (benchmarks/rollout/simulate.py) against the rules they model.

``steps`` is ``playbooks/rollout.yml`` as it runs (hosts fixed per step, a worker per host for
its whole transaction, a barrier per step, 12 steps a job); ``passes`` is the per-node state
machine (a worker only while a node acts). These are unit tests of the model: the decisions are
the collection's own ``rollout_budget`` code, the fleet is virtual.
"""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
sys.path.insert(0, os.path.join(REPO, "benchmarks", "rollout"))

import simulate  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_budget  # noqa: E402  pylint: disable=wrong-import-position


def run(executor, size=200, seed=1000, bad=0.0):
    policy = simulate.BudgetPolicy(executor=executor)
    fleet = simulate.Fleet(size, seed, bad)
    return fleet, simulate.Run(fleet, policy).go()


@pytest.mark.parametrize("kind", ["steps", "passes", "passes_slurm"])
def test_workers_never_above_forks_and_the_fleet_finishes(kind):
    fleet, result = run(simulate.EXECUTORS[kind](4))
    assert result["completion_s"] is not None and result["stopped"] is None
    assert 1 <= result["worker_peak"] <= 4
    assert all(node["status"] in ("done", "failed") for node in fleet.nodes)
    # 10 % of each class: the budget holds whatever the executor.
    assert result["max_oos_pct"] <= 10.0


def test_fixed_steps_with_few_workers_take_longer_than_the_decisions_alone():
    _fleet, unbounded = run(simulate.Unbounded())
    _fleet, steps = run(simulate.Steps(4))
    _fleet, passes = run(simulate.Passes(4))
    # 200 nodes, budget 10 % of each class: up to 20 nodes in flight; 4 workers hold 4 of them
    # for whole transactions in fixed steps; the passes hold a worker only while a node acts.
    assert unbounded["worker_peak"] > 4
    assert steps["completion_s"] > passes["completion_s"] > unbounded["completion_s"] * 0.99
    assert steps["steps"] >= 200 // 4
    # 12 steps a job: more than one job, each after the gap.
    assert steps["jobs"] == -(-steps["steps"] // 12)


def test_a_reboot_in_the_worker_holds_it_longer_than_one_the_scheduler_runs():
    """``passes_slurm`` (``node_upgrade_drain: slurm``): the reboot runs in the install's worker;
    with few workers the same fleet takes longer than with ``passes`` (``slurm_reboot``)."""
    fleet = simulate.Fleet(10, 1000, 0.0)
    node = fleet.nodes[0]
    assert simulate.SlurmDrainPasses(4).install_s(node) == pytest.approx(0.8 * node["work_s"])
    assert simulate.Passes(4).install_s(node) == pytest.approx(0.4 * node["work_s"])
    _fleet, passes = run(simulate.Passes(2))
    _fleet, slurm = run(simulate.SlurmDrainPasses(2))
    assert slurm["completion_s"] > passes["completion_s"]
    assert simulate._flag("False") is False and simulate._flag(" yes ") is True
    with pytest.raises(Exception, match="not a yes/no value"):
        simulate._flag("maybe")


@pytest.mark.parametrize("kind", ["steps", "passes"])
def test_the_step_barrier_waits_for_the_slowest_host(kind):
    """Fixed steps: no node of a later step starts before the slow node of its step is done; the
    passes start nodes meanwhile (the slow node holds its slot, not the executor)."""
    fleet = simulate.Fleet(60, 1000, 0.0)
    for node in fleet.nodes:
        node["drain_s"], node["work_s"] = 60.0, 600.0
    slow = [node for node in fleet.nodes if node["stage"] == "waves"][0]
    # The scheduler knows its jobs run long: it is the first wave node of its class to start.
    slow["drain_s"] = slow["drain_estimate_s"] = 36000.0
    policy = simulate.BudgetPolicy(executor=simulate.EXECUTORS[kind](3, job_gap_s=0.0))
    result = simulate.Run(fleet, policy).go()
    assert result["completion_s"] >= slow["drain_s"] + slow["work_s"]
    meanwhile = [node for node in fleet.nodes if slow["started_at"] < node["started_at"] < slow["finished_at"]]
    later = [node for node in fleet.nodes if node["started_at"] > slow["started_at"]]
    assert len(later) > 20
    if kind == "steps":
        # Only the hosts of the slow node's own step (at most 2 more) start while it drains.
        assert len(meanwhile) <= 2
    else:
        assert len(meanwhile) > 20


def test_step_hosts_is_the_actions_choice():
    """The fixed-step executor and the rollout_step action choose a step's hosts with one function."""
    from ansible_collections.gpufleet.nvidia.plugins.action import rollout_step
    assert rollout_step.choose_hosts is rollout_budget.step_hosts


def test_by_forks_rows_carry_the_issue_keys():
    result = simulate.simulate(120, 1, 1, names={"default"}, forks=[2, 8], executors=("steps", "passes"))
    row = result["policies"]["default"]
    for table in (row["by_forks"], row["by_forks_passes"]):
        assert sorted(table) == ["2", "8"]
        for forks, figures in table.items():
            for key in ("completion_h", "completion_over_floor", "worker_peak", "max_out_of_service_pct",
                        "false_stops", "bad_all_wave_nodes_touched", "bad_2pct_failed_total"):
                assert key in figures, key
            assert figures["worker_peak"] <= int(forks)
            assert figures["capacity_floor_h"] == row["capacity_floor_h"]
        assert table["8"]["completion_h"] < table["2"]["completion_h"]
    assert row["executor"]["steps_per_job"] == 12


def described(count=12, work_s=100.0, drain_s=30.0):
    """Two classes in turn, the first node of each golden, the second canary (scale.py's fleet)."""
    nodes = []
    for index in range(count):
        rank = index // 2
        nodes.append({"name": "node%02d" % (index + 1), "class": ("gpu_h100", "gpu_a100")[index % 2],
                      "stage": "golden" if rank == 0 else "canary" if rank == 1 else "waves",
                      "drain_s": drain_s, "drain_estimate_s": 60.0, "work_s": work_s})
    return nodes


def test_a_described_fleet_is_the_one_given_and_has_no_unrelated_failures():
    fleet = simulate.Fleet.described(described(), seed=3)
    assert [n["name"] for n in fleet.nodes][:3] == ["node01", "node02", "node03"]
    assert fleet.class_sizes() == {"gpu_h100": 6, "gpu_a100": 6}
    assert fleet.rate_per_s == 0.0 and all(n["status"] == "pending" and n["bad"] is False for n in fleet.nodes)
    policy = simulate.BudgetPolicy(executor=simulate.SlurmDrainPasses(4), poll_s=10.0, soak_s=0.0)
    result = simulate.Run(fleet, policy).go()
    assert result["failed"] == 0 and result["stopped"] is None
    assert all(n["status"] == "done" for n in fleet.nodes)
    # One slot per class (10 % of 6, at least 1): each class's nodes one after another.
    assert result["max_oos_by_class"] == {"gpu_h100": pytest.approx(100.0 / 6), "gpu_a100": pytest.approx(100.0 / 6)}
    assert policy.node_soak_s("golden") == 0.0 and simulate.BudgetPolicy().node_soak_s("golden") == simulate.SOAK_S


def test_with_the_slurm_drain_a_node_is_verified_in_the_pass_of_its_install():
    """``node_upgrade_drain: slurm``: install, reboot and verification in one worker, one pass;
    ``slurm_reboot``: the verification waits for a pass after Slurm's reboot."""
    for kind, at_once in (("passes_slurm", True), ("passes", False)):
        fleet = simulate.Fleet.described(described(count=2))
        policy = simulate.BudgetPolicy(executor=simulate.EXECUTORS[kind](4, pass_barrier=False), poll_s=60.0,
                                       soak_s=0.0)
        result = simulate.Run(fleet, policy).go()
        assert result["failed"] == 0
        for node in fleet.nodes:
            # Started at a decision, acted (10 s), drained at 30 s, installed at the next decision.
            work = node["finished_at"] - (node["started_at"] + 60.0)
            assert (work == pytest.approx(100.0)) is at_once, (kind, work)


def test_with_the_pass_barrier_no_pass_begins_before_the_slowest_action_of_the_last_is_done():
    """``pass_barrier`` (the playbook as it runs: one import of rollout_step.yml per pass): while
    one node's long install runs, no other node starts or installs; without it, they do."""
    seen = {}
    for barrier in (True, False):
        nodes = described(count=40, work_s=60.0, drain_s=5.0)
        slow = next(n for n in nodes if n["stage"] == "waves")
        slow["work_s"] = 6000.0
        fleet = simulate.Fleet.described(nodes)
        executor = simulate.SlurmDrainPasses(8, pass_barrier=barrier, pass_overhead_s=20.0)
        result = simulate.Run(fleet, simulate.BudgetPolicy(executor=executor, poll_s=10.0, soak_s=0.0)).go()
        slow = fleet.by_name[slow["name"]]
        assert result["failed"] == 0 and result["worker_peak"] <= 8
        # The slow node's install began one decision after its drain; it ends with its verification.
        install_at = slow["finished_at"] - 6000.0
        seen[barrier] = [n["name"] for n in fleet.nodes
                         if install_at < n["started_at"] < slow["finished_at"] - 1.0]
        if barrier:
            # Passes are far fewer: each waits for its slowest action, and 20 s after it.
            assert result["completion_s"] >= slow["finished_at"] + 20.0
    assert seen[True] == []
    assert len(seen[False]) > 10
