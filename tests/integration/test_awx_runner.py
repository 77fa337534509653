# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's playbooks as AWX runs them: ansible-runner jobs on the simulated fleet.

ansible-runner is AWX's executor. Each job here gets what AWX writes for a job: a private data
directory with ``project/`` (the checkout: the collection's playbooks), ``inventory/``,
``env/extravars`` and ``env/envvars``, and its results under ``artifacts/<ident>/`` (the job's
events, its ``playbook_on_stats`` event with ``artifact_data``: what ``set_stats`` published,
which AWX keeps as the job's artifacts). What stands in for AWX: a slice's job is limited to the
hosts AWX's sliced inventory gives slice *n* of *N* (every *N*-th host from host *n*,
``awx/main/models/inventory.py`` ``get_sliced_hosts``), and one directory of the test stands
for the persistent volume every job mounts (facts and reports). Integration tests: real nodes, real ansible-runner; no AWX server.

One fleet of three nodes (node01 and node02 H100, node03 A100) on the baseline driver, then:

* the facts job in one job and in two slices, each writing the nodes' facts to the persistent
  volume; the drift job over each, and over the runner's own fact cache of the one job
  (ansible-core 2.19's ``jsonfile`` form); the H100 class declares 600 W, its nodes run 700 W:
  the same drift every way, and its summary in the job's artifacts;
* a rollout job over node01 and node03 cancelled mid-step (AWX's cancel: the runner's
  ``cancel_callback``) with node03 done and node01 in flight, and a second job that resumes it:
  each node upgraded once, the summary in the second job's artifacts.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SIMFLEET_DIR = os.path.join(REPO, "tests", "simfleet")
if SIMFLEET_DIR not in sys.path:
    sys.path.append(SIMFLEET_DIR)

from test_rollout_fleet import INVENTORY_VARS, assert_on, benchmark_waiting_after_reboot, rollout_fleet  # noqa: E402
from simfleet.testing import ansible_env, session_fleet_name  # noqa: E402

ansible_runner = pytest.importorskip("ansible_runner")

pytestmark = pytest.mark.fleet

LAYOUT = "h100,h100,a100"
INVENTORY = INVENTORY_VARS + """\
  children:
    gpu_h100:
      vars:
        gpu_policy_power_limit_w: 600
"""


class Jobs(object):
    """ansible-runner jobs in AWX-shaped private data directories over the fleet."""

    def __init__(self, rollouts):
        self.rollouts = rollouts
        self.root = os.path.join(rollouts.dir, "jobs")
        self.count = 0

    def run(self, playbook, extravars, limit=None, cancel_when=None):
        """Run ``playbook`` (a path under playbooks/) as a new job; return ``(runner, artifact_data, fact cache)``.

        ``cancel_when``: a callable polled by the runner; once it returns true the job is
        cancelled as AWX cancels it.
        """
        self.count += 1
        ident = "job-%d" % self.count
        root = os.path.join(self.root, ident)
        shutil.copytree(os.path.join(REPO, "playbooks"), os.path.join(root, "project", "playbooks"))
        os.makedirs(os.path.join(root, "inventory"))
        shutil.copy(self.rollouts.fleet.inventory, os.path.join(root, "inventory", "fleet.yml"))
        shutil.copy(self.rollouts.inventory, os.path.join(root, "inventory", "vars.yml"))
        os.makedirs(os.path.join(root, "env"))
        with open(os.path.join(root, "env", "extravars"), "w") as handle:
            json.dump(extravars, handle)
        env = ansible_env(self.rollouts.env)
        keep = ("PATH", "ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_HOST_KEY_CHECKING")
        envvars = dict((key, env[key]) for key in keep if key in env)
        with open(os.path.join(root, "env", "envvars"), "w") as handle:
            json.dump(envvars, handle)
        kwargs = {}
        if cancel_when is not None:
            kwargs["cancel_callback"] = cancel_when
        runner = ansible_runner.run(private_data_dir=root, playbook="playbooks/" + playbook, ident=ident,
                                    limit=limit, quiet=True, **kwargs)
        return runner, stats_artifacts(root, ident), os.path.join(root, "artifacts", ident, "fact_cache")


def stats_artifacts(root, ident):
    """``artifact_data`` of the job's ``playbook_on_stats`` event (``None`` when the job ended before it)."""
    events_dir = os.path.join(root, "artifacts", ident, "job_events")
    for name in sorted(os.listdir(events_dir)):
        with open(os.path.join(events_dir, name)) as handle:
            event = json.load(handle)
        if event.get("event") == "playbook_on_stats":
            return event["event_data"].get("artifact_data") or {}
    return None


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    for handle in rollout_fleet(tmp_path_factory, session_fleet_name("pytest-awx-runner"), None, LAYOUT,
                                inventory=INVENTORY):
        yield Jobs(handle)


def facts_job(jobs, facts_dir, limit=None):
    """The facts job: each node's ``ansible_facts.nvidia`` into ``facts_dir`` (the persistent volume)."""
    os.makedirs(facts_dir, exist_ok=True)
    runner, published, fact_cache = jobs.run("facts.yml", {"gpufleet_facts_dir": facts_dir}, limit=limit)
    assert (runner.rc, runner.status) == (0, "successful"), runner.stdout.read()[-3000:]
    assert published == {}  # the facts job publishes nothing
    return runner, fact_cache


def drift_job(jobs, name, source, path):
    out = os.path.join(jobs.rollouts.dir, "drift-" + name)
    runner, published = jobs.run("drift_report.yml", {
        "drift_source": source, "drift_path": path, "drift_output_dir": out, "drift_report_only": "true"})[:2]
    assert (runner.rc, runner.status) == (0, "successful"), runner.stdout.read()[-3000:]
    with open(os.path.join(out, "drift-report.json")) as handle:
        return published["gpufleet_drift"], json.load(handle)


def power_findings(report):
    return sorted((f["node"], f["gpu"], f["actual"], f["expected"]) for f in report["findings"]
                  if f["check"] == "power_limit_w")


def test_sliced_facts_jobs_give_the_drift_of_one_job_from_either_fact_form(jobs):
    one_dir = os.path.join(jobs.rollouts.dir, "facts-one")
    runner, fact_cache = facts_job(jobs, one_dir)
    assert sorted(os.listdir(one_dir)) == ["node01.json", "node02.json", "node03.json"]
    # ansible-runner's own fact cache of the job (jsonfile, ansible-core 2.19's s1_<host> form).
    assert sorted(os.listdir(fact_cache)) == ["s1_node01", "s1_node02", "s1_node03"]
    one, one_report = drift_job(jobs, "one-job", "dir", one_dir)
    cached, cached_report = drift_job(jobs, "fact-cache", "jsonfile", fact_cache)
    # The same facts gathered by two slices: slice 1 takes node01 and node03, slice 2 node02.
    sliced_dir = os.path.join(jobs.rollouts.dir, "facts-sliced")
    for hosts in (["node01", "node03"], ["node02"]):
        runner = facts_job(jobs, sliced_dir, limit=",".join(hosts))[0]
        assert set(runner.stats["ok"]) == set(hosts)
    sliced, sliced_report = drift_job(jobs, "sliced", "dir", sliced_dir)
    # The H100s run 700 W against a declared 600 W; the A100 declares nothing: in sync.
    assert one["drift"] is True and one["drifted_nodes"] == ["node01", "node02"]
    assert (one["summary"]["nodes"], one["summary"]["in_sync"], one["summary"]["drifted"]) == (3, 1, 2)
    for other in (cached, sliced):
        assert (other["drifted_nodes"], other["summary"]) == (one["drifted_nodes"], one["summary"])
    power = power_findings(one_report)
    assert len(power) == 16 and all(found[2:] == (700.0, 600.0) for found in power)
    assert power_findings(cached_report) == power and power_findings(sliced_report) == power


def test_a_cancelled_rollout_job_is_resumed_by_the_next(jobs):
    rollouts = jobs.rollouts
    report_dir = rollouts.report_dir("awx")
    # node01 (H100) and node03 (A100) run at once, a class each. node01's benchmark waits once
    # after its reboot into 620.82.01, so the job is cancelled with node03 recorded and node01
    # in flight: on its new driver, drained, locked, not verified.
    extravars = {"driver_branch": "ltsb", "rollout_id": "awx", "rollout_hosts": "node01:node03",
                 "rollout_report_dir": report_dir, "rollout_soak_s": "0", "rollout_allow_no_golden": "true",
                 "rollout_allow_no_canary": "true",
                 "node_upgrade_benchmark_command": benchmark_waiting_after_reboot("node01", "620.82.01")}
    seen = {}

    def cancel_when():
        # Looked at every 2 s (the runner asks far more often).
        if not seen.get("cancel") and time.time() - seen.get("looked", 0) >= 2:
            seen["looked"] = time.time()
            if rollouts.record("awx", "node03") and rollouts.fleet.run(
                    "node01", "test -d /run/gpufleet-bench-waited").returncode == 0:
                seen["cancel"] = True
        return bool(seen.get("cancel"))

    runner, published = jobs.run("rollout.yml", extravars, cancel_when=cancel_when)[:2]
    assert seen.get("cancel"), "the first job ended before it could be cancelled: %s" % runner.stdout.read()[-3000:]
    assert runner.status == "canceled"
    assert "gpufleet_rollout" not in (published or {})  # cancelled mid-step: nothing published
    node03 = rollouts.record("awx", "node03")
    assert node03["result"] == "upgraded" and rollouts.record("awx", "node01") is None
    assert rollouts.drained("node01") and rollouts.lock_exists("node01")

    runner, published = jobs.run("rollout.yml", extravars)[:2]
    assert (runner.rc, runner.status) == (0, "successful"), runner.stdout.read()[-3000:]
    outcome = published["gpufleet_rollout"]
    assert outcome["rollout_id"] == "awx" and outcome["status"] == "completed"
    assert outcome["summary"]["upgraded"] == 2 and outcome["stopped_by"] == []
    assert outcome["paths"]["json"] == os.path.join(report_dir, "rollout-report.json")
    # node03, finished by the cancelled job, keeps its record; node01 is resumed, not started again.
    assert rollouts.record("awx", "node03")["run_id"] == node03["run_id"]
    node01 = rollouts.record("awx", "node01")
    assert node01["result"] == "upgraded" and node01["resumed"] is True and node01["run_id"] != node03["run_id"]
    assert rollouts.started("awx") == {"node01": 1, "node03": 1}
    for node in ("node01", "node03"):
        assert_on(rollouts, node, "620.82.01")
        assert not rollouts.lock_exists(node) and not rollouts.drained(node)
