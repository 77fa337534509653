# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's ``slurm`` drain against a real Slurm cluster (``make_fleet(..., slurm=True)``).

Integration tests, not stand-ins: slurmctld runs on the host, slurmd in each simulated node
(Debian's slurm-wlm 22.05), jobs are real ``sbatch`` jobs, and every Slurm state asserted here is
read with ``scontrol show node -o``. The Slurm commands of the rollout run on the controller host
(``node_upgrade_drain_host: localhost``) through the fleet's wrappers (``<fleet>/slurm/bin`` first
in ``PATH``: they point ``scontrol`` at the fleet's ``slurm.conf``).

One fleet of three nodes (node01 H100, node02 A100, node03 L40S: a class each, so each has its
own slot), every node first on the baseline driver 580.126.20. Then, in order:

* one rollout (``slurm-a``) over the three nodes: node01 runs a batch job (time limit 30 minutes,
  which the rollout reads from squeue as its drain estimate) when the rollout
  starts (it ends 20 s after the test has seen Slurm show node01 DRAINING), node02 was drained by an operator beforehand (another reason), node03's module build
  fails (fault ``build_fail``). node01 is drained only once its job has ended and is installed
  after that, then resumed (IDLE); node02 is refused and stays drained with the operator's
  reason; node03 is rolled back and stays DRAIN with the rollout's reason;
* ``rollback.yml`` over node02 and node03 returns node03 (the rollout drained it) to service and
  leaves node02 (the operator's) drained with its reason;
* ``node_upgrade_drain: slurm_reboot`` on node03 while a job runs there: the run stages the driver,
  asks Slurm for the reboot (``nextstate=DOWN``) and ends while the job still runs; the job ends,
  Slurm reboots node03 and leaves it DOWN: a job queued for node03 does not start; the next run of
  the same rollout verifies node03 and only then resumes it (upgraded), and the queued job starts
  after the verification (field case 40);
* ``slurm_reboot`` on node02 (the operator's drain lifted) whose GPU is lost at the next boot:
  Slurm reboots it, it stays DOWN, the next run fails its verification and rolls it back; it
  stays drained and flagged, the job queued for it never starts there, and a job free to run
  anywhere runs on another node;
* ``rollout_executor: passes`` over the three nodes in one class, node03 busy: with
  ``slurm_reboot``, one run stages node03, leaves it to Slurm while its job runs and verifies it
  after; with the ``slurm`` drain, the pass that asks for node03's drain leaves it waiting in the
  journal and a pass after its job ends installs, reboots and verifies it. In both, no pass takes
  node03 while its job runs.
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

from test_rollout_fleet import BASELINE, ROLLBACK, Rollouts, assert_on, rollout_fleet, wait_for  # noqa: E402
from simfleet.testing import FLEET_DRIVER_VARS, session_fleet_name  # noqa: E402

pytestmark = pytest.mark.fleet

LAYOUT = "h100,a100,l40s"
TARGET = "620.82.01"
JOB_S = 20
# A job that waits (at most 20 minutes) until the test lets it go, then runs JOB_S seconds more and
# writes its end time (the node shares the host's clock).
JOB_SCRIPT = ("i=0; while [ ! -e %(go)s ] && [ $i -lt 1200 ]; do sleep 1; i=$((i+1)); done; "
              "sleep " + str(JOB_S) + "; date +%%s.%%N > %(end)s")
OPERATOR_REASON = "fan replaced, burn-in pending"

INVENTORY = "all:\n  vars:\n" + FLEET_DRIVER_VARS + """\
    node_upgrade_drain: slurm
    node_upgrade_slurm_node_name: "{{ simfleet_slurm_node_name }}"
    node_upgrade_drain_poll_s: 2
    node_upgrade_drain_timeout_s: 300
    node_upgrade_reboot_timeout_s: %(reboot_timeout_s)d
    node_upgrade_rescue_connect_timeout_s: 15
"""


class SlurmRollouts(Rollouts):
    """Rollouts whose drain is the fleet's Slurm: ``drained`` reads ``scontrol show node -o``."""

    def slurm_node(self, node):
        """``{"state": "IDLE+DRAIN", "drain": bool, "summary", "reason": str | None}`` of ``node``."""
        from simfleet import slurmconf  # pylint: disable=import-outside-toplevel

        fields = self.fleet.slurm_nodes()[node]
        reason = fields.get("Reason")
        return dict(slurmconf.node_state(fields), state=fields["State"],
                    reason=reason.split(" [", 1)[0] if reason and reason != "(null)" else None)

    def drained(self, node):
        return self.slurm_node(node)["drain"]

    def sbatch(self, node, script, time_limit=None):
        """Submit ``script`` as a batch job on ``node`` (one GPU; ``time_limit`` as sbatch's ``--time``);
        its job id."""
        limit = ["--time=" + time_limit] if time_limit else []
        proc = self.fleet.slurm(["sbatch", "--parsable", "--nodelist=" + node, "--chdir=/root", "--gres=gpu:1",
                                 "--output=/root/job-%j.out"] + limit + ["--wrap", script], check=True)
        return proc.stdout.strip().split(";")[0]

    def job_state(self, job):
        return self.fleet.slurm(["squeue", "--noheader", "--jobs", job, "--format", "%T"]).stdout.strip()


@pytest.fixture(scope="module")
def slurm_rollouts(tmp_path_factory):
    yield from rollout_fleet(tmp_path_factory, session_fleet_name("pytest-rollout-slurm"), os.environ.get("ROLLOUT_SLURM_PORTS"),
                             LAYOUT, slurm=True, handle_class=SlurmRollouts, inventory=INVENTORY, reboot_timeout_s=180)


@pytest.fixture(scope="module")
def first_rollout(slurm_rollouts):
    """The rollout ``slurm-a`` over a busy node01, an operator-drained node02 and a failing node03.

    node01's job runs until the test has seen Slurm show node01 DRAINING (the rollout's drain
    made while the job runs), then ends a few seconds later: the drain must wait for it.
    """
    rollouts = slurm_rollouts
    rollouts.fleet.slurm(["scontrol", "update", "NodeName=node02", "State=DRAIN", "Reason=" + OPERATOR_REASON],
                         check=True)
    rollouts.fleet.fault("node03", "build_fail", version=TARGET)
    job = rollouts.sbatch("node01", JOB_SCRIPT % {"go": "/root/go", "end": "/root/job-end"}, time_limit="30")
    wait_for(lambda: rollouts.job_state(job) == "RUNNING", 60, "job %s running on node01" % job)
    started = time.time()
    proc, log = rollouts.rollout("slurm-a", "node01:node02:node03", start=True)
    draining = {}
    estimates = {}

    def seen_draining():
        draining.update(rollouts.slurm_node("node01"))
        try:
            with open(os.path.join(rollouts.report_dir("slurm-a"), "drain_estimates.json")) as handle:
                estimates.update(json.load(handle)["ends"])
        except (OSError, ValueError):
            pass
        return draining["summary"] == "draining" or proc.poll() is not None

    wait_for(seen_draining, 1200, "the rollout to drain node01")
    release(rollouts, "node01", "/root/go")
    proc.wait(timeout=1800)
    with open(log) as handle:
        text = handle.read()
    with open(os.path.join(rollouts.fleet.root_of("node01"), "root", "job-end")) as handle:
        job_end = float(handle.read().strip())
    return {"code": proc.returncode, "log": text, "job": job, "job_end": job_end, "started": started,
            "draining": draining, "estimates": estimates}


def release(rollouts, node, path):
    """Let the waiting job on ``node`` go on (it ends JOB_S seconds later)."""
    with open(os.path.join(rollouts.fleet.root_of(node), path.lstrip("/")), "w") as handle:
        handle.write("go\n")


def test_a_busy_node_is_drained_and_upgraded_only_after_its_job_ends(slurm_rollouts, first_rollout):
    rollouts = slurm_rollouts
    # node03 failed: the host fails and the rollout stops (2).
    assert first_rollout["code"] == 2, first_rollout["log"][-4000:]
    record = rollouts.record("slurm-a", "node01")
    assert record["result"] == "upgraded", record
    marks = record["marks"]
    job_end = first_rollout["job_end"]
    # The transaction began while the job ran; the drain ended, and the install began, after it ended.
    assert float(marks["started"]) < job_end, (marks, job_end)
    assert job_end <= float(marks["drained"]) <= float(marks["installed"]), (marks, job_end)
    assert first_rollout["draining"]["reason"] == "gpufleet slurm-a: driver rollout", first_rollout["draining"]
    # Slurm showed the job's node busy when the rollout read it, and the drain is the rollout's.
    assert record["drain"]["backend"] == "slurm" and record["drain"]["owned"] is True, record["drain"]
    assert record["drain"]["before"] in ("ALLOCATED", "MIXED"), record["drain"]
    assert rollouts.job_state(first_rollout["job"]) == ""
    assert_on(rollouts, "node01", TARGET)
    # The step that started node01 read its job's time left from squeue (a 30-minute limit) for
    # the longest-drain-first order; the idle nodes had no job, so no estimate.
    ends = first_rollout["estimates"]
    assert sorted(ends) == ["node01"], ends
    assert 1500 < ends["node01"] - first_rollout["started"] <= 1860, (ends, first_rollout["started"])


def test_the_rollout_resumes_only_the_nodes_it_drained(slurm_rollouts, first_rollout):
    rollouts = slurm_rollouts
    assert first_rollout["code"] == 2, first_rollout["log"][-4000:]
    node01 = rollouts.slurm_node("node01")
    assert node01["state"] == "IDLE" and node01["reason"] is None, node01
    # The drain record is gone from the node the rollout returned to service.
    assert rollouts.fleet.run("node01", "test -e /var/lib/gpufleet/rollout/drain.json").returncode == 1


def test_a_node_an_operator_drained_stays_drained_with_its_reason(slurm_rollouts, first_rollout):
    rollouts = slurm_rollouts
    assert first_rollout["code"] == 2, first_rollout["log"][-4000:]
    record = rollouts.record("slurm-a", "node02")
    assert record["result"] == "refused" and "drained_by_others" in record["flags"], record
    # The reason names who drained it and when (Slurm's [user@time] stamp), as scontrol shows it.
    assert "drained in slurm before the rollout (%s, root@" % OPERATOR_REASON in record["reason"], record["reason"]
    assert record["drain"]["owned"] is False and record["drain"]["reason_before"] == OPERATOR_REASON
    node02 = rollouts.slurm_node("node02")
    assert node02["state"] == "IDLE+DRAIN" and node02["reason"] == OPERATOR_REASON, node02
    assert_on(rollouts, "node02", BASELINE)


def test_a_failed_node_stays_drained_with_the_rollouts_reason(slurm_rollouts, first_rollout):
    rollouts = slurm_rollouts
    assert first_rollout["code"] == 2, first_rollout["log"][-4000:]
    record = rollouts.record("slurm-a", "node03")
    assert record["result"] == "rolled_back" and "apt-get failed" in record["reason"], record
    assert record["drain"]["owned"] is True
    node03 = rollouts.slurm_node("node03")
    assert node03["state"] == "IDLE+DRAIN", node03
    assert node03["reason"] == "gpufleet slurm-a: driver rollout", node03
    assert rollouts.flag("node03")["rollout_id"] == "slurm-a"
    assert_on(rollouts, "node03", BASELINE)
    assert [q["node"] for q in rollouts.report("slurm-a")["quarantined"]] == ["node03"]


def test_rollback_returns_the_nodes_the_rollout_drained_and_no_other(slurm_rollouts, first_rollout):
    rollouts = slurm_rollouts
    assert first_rollout["code"] == 2, first_rollout["log"][-4000:]
    rollouts.fleet.fault("node03", "clear")
    code, log = rollouts.run(ROLLBACK, "-e", "rollback_hosts=node02:node03", "-e", "rollback_id=slurm-back",
                             "-e", "rollback_report_dir=%s" % rollouts.report_dir("slurm-back"))
    assert code == 0, log[-4000:]
    records = dict((n["node"], n) for n in rollouts.report("slurm-back")["nodes"])
    assert records["node03"]["result"] == "rolled_back", records["node03"]
    assert "left drained" not in records["node03"]["reason"], records["node03"]
    node03 = wait_for_state(rollouts, "node03", "IDLE")
    assert node03["reason"] is None
    assert rollouts.flag("node03") is None
    assert_on(rollouts, "node03", BASELINE)
    node02 = rollouts.slurm_node("node02")
    assert node02["state"] == "IDLE+DRAIN" and node02["reason"] == OPERATOR_REASON, node02


def wait_for_state(rollouts, node, state, timeout=30):
    """Wait until ``scontrol show node`` gives ``node`` the State ``state`` (a resumed node is pinged
    first: IDLE+NOT_RESPONDING for a moment); its Slurm state."""
    seen = {}

    def reached():
        seen.update(rollouts.slurm_node(node))
        return seen["state"] == state

    wait_for(reached, timeout, "%s to be %s in Slurm" % (node, state))
    return seen


def _base_state(rollouts, node):
    return rollouts.slurm_node(node)["state"].split("+", 1)[0]


def test_slurm_reboot_upgrades_a_busy_node_after_its_job_without_the_controller_waiting(slurm_rollouts, first_rollout):
    """``node_upgrade_drain: slurm_reboot`` on node03 (on the baseline again, IDLE) while a job runs on it."""
    rollouts = slurm_rollouts
    assert first_rollout["code"] == 2, first_rollout["log"][-4000:]
    before_boot = rollouts.fleet.boot_id("node03")
    job = rollouts.sbatch("node03", JOB_SCRIPT % {"go": "/root/go-r", "end": "/root/job-end-r"})
    wait_for(lambda: rollouts.job_state(job) == "RUNNING", 60, "job %s running on node03" % job)
    code, log = rollouts.rollout("slurm-r", "node03", "-e", "node_upgrade_drain=slurm_reboot")
    # The run staged the driver, asked Slurm for the reboot and ended while the job still runs.
    assert code == 0, log[-4000:]
    assert rollouts.job_state(job) == "RUNNING"
    record = rollouts.record("slurm-r", "node03")
    assert record["result"] == "pending", record
    assert rollouts.report("slurm-r")["status"] == "in_progress"
    assert rollouts.userspace("node03") == TARGET and rollouts.loaded("node03") == BASELINE
    assert rollouts.fleet.boot_id("node03") == before_boot
    node03 = rollouts.slurm_node("node03")
    assert node03["drain"] and "REBOOT_REQUESTED" in node03["flags"], node03
    assert node03["reason"] == "gpufleet slurm-r: driver rollout", node03
    # The hold is written; it keeps slurmd from starting only in a later boot.
    assert slurmd_held(rollouts, "node03") == (True, True)
    # Slurm reboots the node once the job has ended and leaves it DOWN (nextstate=DOWN): not in service.
    release(rollouts, "node03", "/root/go-r")
    wait_for(lambda: rollouts.job_state(job) == "", JOB_S + 120, "job %s to end" % job)
    wait_for(lambda: rollouts.fleet.boot_id("node03") not in (None, before_boot), 300, "node03's reboot by Slurm")
    wait_for(lambda: rollouts.fleet.run("node03", ["true"]).returncode == 0, 120, "node03's sshd after its reboot")
    wait_for(lambda: _base_state(rollouts, "node03") == "DOWN", 300, "node03 DOWN in Slurm after its reboot")
    with open(os.path.join(rollouts.fleet.root_of("node03"), "root", "job-end-r")) as handle:
        job_end = float(handle.read().strip())
    assert float(record["finished_epoch"]) < job_end
    # A job queued for node03 now waits: nothing runs on the new driver before it is verified.
    queued = rollouts.sbatch("node03", "date +%s.%N > /root/job-start-q")
    time.sleep(10)
    assert rollouts.job_state(queued) == "PENDING"
    assert _base_state(rollouts, "node03") == "DOWN"
    assert slurmd_held(rollouts, "node03") == (True, False)
    # The next run verifies it, then resumes it.
    code, log = rollouts.rollout("slurm-r", "node03", "-e", "node_upgrade_drain=slurm_reboot")
    assert code == 0, log[-4000:]
    record = rollouts.record("slurm-r", "node03")
    assert record["result"] == "upgraded", record
    assert record["reason"] == "rebooted by Slurm; verified on %s" % TARGET, record["reason"]
    assert float(record["marks"]["rebooted"]) > job_end
    assert rollouts.started("slurm-r") == {"node03": 1}
    assert rollouts.report("slurm-r")["status"] == "completed"
    assert_on(rollouts, "node03", TARGET)
    wait_for(lambda: rollouts.job_state(queued) == "", 120, "the queued job %s to run on node03" % queued)
    with open(os.path.join(rollouts.fleet.root_of("node03"), "root", "job-start-q")) as handle:
        queued_start = float(handle.read().strip())
    assert queued_start > float(record["marks"]["verified"]), (queued_start, record["marks"])
    node03 = wait_for_state(rollouts, "node03", "IDLE", timeout=60)
    assert node03["reason"] is None, node03
    assert slurmd_held(rollouts, "node03") == (False, True)
    assert rollouts.fleet.run("node03", "test -e /var/lib/gpufleet/rollout/drain.json").returncode == 1
    assert not rollouts.lock_exists("node03")


def slurmd_held(rollouts, node):
    """(hold file on the node, slurmd running there): the hold of tasks/slurm_reboot.yml."""
    held = rollouts.fleet.run(node, "test -e /var/lib/gpufleet/rollout/slurmd-hold.json").returncode == 0
    active = rollouts.fleet.run(node, "systemctl is-active slurmd.service").stdout.strip() == "active"
    return held, active


def test_slurm_reboot_into_a_failing_driver_never_takes_a_job(slurm_rollouts, first_rollout):
    """node02 (on the baseline; the operator's drain lifted) loses a GPU at the boot Slurm runs."""
    rollouts = slurm_rollouts
    assert first_rollout["code"] == 2, first_rollout["log"][-4000:]
    rollouts.fleet.slurm(["scontrol", "update", "NodeName=node02", "State=RESUME"], check=True)
    wait_for_state(rollouts, "node02", "IDLE", timeout=60)
    assert_on(rollouts, "node02", BASELINE)
    rollouts.fleet.fault("node02", "gpu_lost", gpu="0")
    before_boot = rollouts.fleet.boot_id("node02")
    code, log = rollouts.rollout("slurm-f", "node02", "-e", "node_upgrade_drain=slurm_reboot")
    assert code == 0, log[-4000:]
    assert rollouts.record("slurm-f", "node02")["result"] == "pending"
    wait_for(lambda: rollouts.fleet.boot_id("node02") not in (None, before_boot), 300, "node02's reboot by Slurm")
    wait_for(lambda: rollouts.fleet.run("node02", ["true"]).returncode == 0, 120, "node02's sshd after its reboot")
    wait_for(lambda: _base_state(rollouts, "node02") == "DOWN", 300, "node02 DOWN in Slurm after its reboot")
    pinned = rollouts.sbatch("node02", "hostname > /root/job-pinned")
    # slurmctld pings every SlurmdTimeout / 3 (20 s) and, with ReturnToService=2, returns a DOWN
    # node that answers to service: slurmd is held at this boot, so two pings later node02 is DOWN still.
    time.sleep(45)
    assert _base_state(rollouts, "node02") == "DOWN"
    assert rollouts.job_state(pinned) == "PENDING"
    assert slurmd_held(rollouts, "node02") == (True, False)
    # The next run finds a GPU missing: not verified, rolled back, left drained and flagged.
    code, log = rollouts.rollout("slurm-f", "node02", "-e", "node_upgrade_drain=slurm_reboot")
    assert code == 2, log[-4000:]
    record = rollouts.record("slurm-f", "node02")
    # The GPU stays lost on the last known-good driver too: rolled back, not verified there, flagged.
    assert record["result"] == "flagged" and {"gpu_unreadable", "gpu_count_changed"} & set(record["flags"]), record
    assert record["rollback"]["version"] == BASELINE, record["rollback"]
    assert rollouts.flag("node02")["rollout_id"] == "slurm-f"
    node02 = rollouts.slurm_node("node02")
    assert node02["drain"] or _base_state(rollouts, "node02") == "DOWN", node02
    assert node02["reason"] == "gpufleet slurm-f: driver rollout", node02
    # The pinned job never ran on node02 (it stays queued, or Slurm gives up on it); a job free to run on
    # any node runs elsewhere.
    assert rollouts.job_state(pinned) in ("PENDING", "")
    assert rollouts.fleet.run("node02", "test -e /root/job-pinned").returncode == 1
    # Rebooted into the last known-good driver, it is held still: out of service until an operator
    # (or rollback.yml) returns it.
    assert slurmd_held(rollouts, "node02") == (True, False)
    proc = rollouts.fleet.slurm(["sbatch", "--parsable", "--chdir=/root", "--gres=gpu:1",
                                 "--output=/root/job-%j.out", "--wrap", "hostname > /root/job-free"], check=True)
    free = proc.stdout.strip().split(";")[0]
    wait_for(lambda: rollouts.job_state(free) == "", 120, "job %s to run" % free)
    ran_on = [n for n in ("node01", "node02", "node03")
              if os.path.exists(os.path.join(rollouts.fleet.root_of(n), "root", "job-free"))]
    assert ran_on and "node02" not in ran_on, ran_on
    rollouts.fleet.slurm(["scancel", pinned])
    # Its GPU back, rollback.yml (the plain slurm mode of the inventory) returns it: the hold lifted,
    # slurmd started and registered, the node resumed, the flag cleared.
    rollouts.fleet.fault("node02", "clear")
    code, log = rollouts.run(ROLLBACK, "-e", "rollback_hosts=node02", "-e", "rollback_id=slurm-f-back",
                             "-e", "rollback_report_dir=%s" % rollouts.report_dir("slurm-f-back"))
    assert code == 0, log[-4000:]
    node02 = wait_for_state(rollouts, "node02", "IDLE", timeout=60)
    assert node02["reason"] is None, node02
    assert slurmd_held(rollouts, "node02") == (False, True)
    assert rollouts.flag("node02") is None
    assert_on(rollouts, "node02", BASELINE)


def journal_events(rollouts, rollout_id):
    with open(os.path.join(rollouts.report_dir(rollout_id), "journal.jsonl")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def wait_for_a_pass_after(rollouts, rollout_id, event, node, proc):
    """Wait until the journal holds a pass begun after ``node``'s first ``event`` (or the run ended).

    A pass lasts as long as its slowest host's action (an install and reboot of another node), so
    a fixed sleep may end before the next pass has begun; the tests release a job only after one.
    """
    def seen():
        try:
            events = journal_events(rollouts, rollout_id)
        except (OSError, ValueError):
            return proc.poll() is not None
        marks = [e["time"] for e in events if e.get("event") == event and e.get("node") == node]
        return (bool(marks) and any(e.get("event") == "pass" and e["time"] > marks[0] for e in events)) \
            or proc.poll() is not None

    wait_for(seen, 600, "a pass after %s's %s" % (node, event))
    assert proc.poll() is None


def on_baseline(rollouts, rollback_id):
    """Every node on the baseline, in service, without a fault (whichever tests ran before)."""
    for node in ("node02", "node03"):
        rollouts.fleet.fault(node, "clear")
    if rollouts.slurm_node("node02")["drain"]:
        rollouts.fleet.slurm(["scontrol", "update", "NodeName=node02", "State=RESUME"], check=True)
    code, log = rollouts.run(ROLLBACK, "-e", "rollback_hosts=node01:node02:node03", "-e", "rollback_id=" + rollback_id,
                             "-e", "rollback_version=%s" % BASELINE,
                             "-e", "rollback_report_dir=%s" % rollouts.report_dir(rollback_id))
    assert code == 0, log[-4000:]
    for node in ("node01", "node02", "node03"):
        wait_for_state(rollouts, node, "IDLE", timeout=60)
        assert_on(rollouts, node, BASELINE)


def test_passes_upgrade_every_node_in_one_run_and_take_no_worker_for_a_node_that_waits(slurm_rollouts, first_rollout):
    """``rollout_executor: passes`` with ``slurm_reboot`` over the three nodes, one class (budget 3,
    window 1 then 2), node03 busy: a pass takes only the nodes whose next action is ready."""
    rollouts = slurm_rollouts
    assert first_rollout["code"] == 2, first_rollout["log"][-4000:]
    on_baseline(rollouts, "slurm-p-base")
    job = rollouts.sbatch("node03", JOB_SCRIPT % {"go": "/root/go-p", "end": "/root/job-end-p"}, time_limit="30")
    wait_for(lambda: rollouts.job_state(job) == "RUNNING", 60, "job %s running on node03" % job)
    proc, out = rollouts.rollout("slurm-p", "node01:node02:node03", "-e", "node_upgrade_drain=slurm_reboot",
                                 "-e", "rollout_executor=passes", "-e", "rollout_pass_s=5",
                                 "-e", "rollout_class_prefix=none_", "-e", "rollout_max_unavailable=3",
                                 start=True)

    def node03_pending():
        try:
            events = journal_events(rollouts, "slurm-p")
        except (OSError, ValueError):
            return proc.poll() is not None
        return any(e.get("event") == "pending" and e.get("node") == "node03" for e in events) \
            or proc.poll() is not None

    wait_for(node03_pending, 900, "node03 staged and its reboot asked of Slurm")
    assert proc.poll() is None, open(out).read()[-4000:]
    # Staged while its job runs, draining: the passes go on without it until the job ends.
    assert rollouts.job_state(job) == "RUNNING"
    assert rollouts.slurm_node("node03")["drain"]
    wait_for_a_pass_after(rollouts, "slurm-p", "pending", "node03", proc)
    assert rollouts.job_state(job) == "RUNNING"
    release(rollouts, "node03", "/root/go-p")
    proc.wait(timeout=1200)
    with open(out) as handle:
        text = handle.read()
    assert proc.returncode == 0, text[-4000:]
    with open(os.path.join(rollouts.fleet.root_of("node03"), "root", "job-end-p")) as handle:
        job_end = float(handle.read().strip())
    # One run: every node upgraded, each started once.
    report = rollouts.report("slurm-p")
    assert report["status"] == "completed", report["status"]
    assert rollouts.started("slurm-p") == {"node01": 1, "node02": 1, "node03": 1}
    for node in ("node01", "node02", "node03"):
        record = rollouts.record("slurm-p", node)
        assert record["result"] == "upgraded", record
        assert record["reason"] == "rebooted by Slurm; verified on %s" % TARGET, record["reason"]
        assert_on(rollouts, node, TARGET)
        assert wait_for_state(rollouts, node, "IDLE", timeout=60)["reason"] is None
        assert slurmd_held(rollouts, node) == (False, True)
        assert not rollouts.lock_exists(node)
    assert float(rollouts.record("slurm-p", "node03")["marks"]["rebooted"]) > job_end
    events = journal_events(rollouts, "slurm-p")
    passes = [e for e in events if e["event"] == "pass"]
    # The window held two installs back: each waited in the journal, not in a worker, and was taken
    # up by a later pass.
    waited = [e["node"] for e in events if e["event"] == "waiting"]
    assert len(waited) >= 1, [e for e in events if e.get("node")]
    # Passes ran while node03's job did, after its reboot was asked, without node03: waiting on
    # Slurm held no worker.
    pending_at = next(e["time"] for e in events if e["event"] == "pending" and e["node"] == "node03")
    meanwhile = [p for p in passes if pending_at < p["time"] < job_end]
    assert meanwhile and all("node03" not in p["hosts"] for p in meanwhile), (meanwhile, pending_at, job_end)
    # Each pass began at least rollout_pass_s after the one before.
    gaps = [b["time"] - a["time"] for a, b in zip(passes, passes[1:])]
    assert gaps and min(gaps) >= 5.0, gaps
    # node03 acted in few passes: its start, its install, its verification (and any pass that
    # found it still rebooting), never in one while its job ran.
    assert 2 <= sum("node03" in p["hosts"] for p in passes) <= 5, [p["hosts"] for p in passes]
    # The last pass found every node done and took no host: the run ended there.
    assert passes[-1]["states"] == {"done": 3} and passes[-1]["hosts"] == [], passes[-1]


def test_passes_leave_a_busy_node_draining_in_the_journal_and_install_it_after_its_job(slurm_rollouts, first_rollout):
    """``rollout_executor: passes`` with the ``slurm`` drain over the three nodes, one class, node03
    busy: the pass that asks for its drain leaves it waiting in the journal; later passes go on
    without it while its job runs, and one after the job ends installs, reboots and verifies it."""
    rollouts = slurm_rollouts
    assert first_rollout["code"] == 2, first_rollout["log"][-4000:]
    on_baseline(rollouts, "slurm-d-base")
    job = rollouts.sbatch("node03", JOB_SCRIPT % {"go": "/root/go-d", "end": "/root/job-end-d"}, time_limit="30")
    wait_for(lambda: rollouts.job_state(job) == "RUNNING", 60, "job %s running on node03" % job)
    proc, out = rollouts.rollout("slurm-d", "node01:node02:node03", "-e", "rollout_executor=passes",
                                 "-e", "rollout_pass_s=5", "-e", "rollout_class_prefix=none_",
                                 "-e", "rollout_max_unavailable=3", start=True)

    def node03_waits():
        try:
            events = journal_events(rollouts, "slurm-d")
        except (OSError, ValueError):
            return proc.poll() is not None
        return any(e.get("event") == "waiting" and e.get("for") == "drain" and e.get("node") == "node03"
                   for e in events) or proc.poll() is not None

    wait_for(node03_waits, 900, "node03 left draining by a pass")
    assert proc.poll() is None, open(out).read()[-4000:]
    assert rollouts.job_state(job) == "RUNNING"
    assert rollouts.slurm_node("node03")["summary"] == "draining"
    wait_for_a_pass_after(rollouts, "slurm-d", "waiting", "node03", proc)
    assert rollouts.job_state(job) == "RUNNING"
    release(rollouts, "node03", "/root/go-d")
    proc.wait(timeout=1200)
    with open(out) as handle:
        text = handle.read()
    assert proc.returncode == 0, text[-4000:]
    with open(os.path.join(rollouts.fleet.root_of("node03"), "root", "job-end-d")) as handle:
        job_end = float(handle.read().strip())
    report = rollouts.report("slurm-d")
    assert report["status"] == "completed", report["status"]
    assert rollouts.started("slurm-d") == {"node01": 1, "node02": 1, "node03": 1}
    for node in ("node01", "node02", "node03"):
        record = rollouts.record("slurm-d", node)
        assert record["result"] == "upgraded", record
        assert record["reason"] == "verified on %s" % TARGET, record["reason"]
        assert_on(rollouts, node, TARGET)
        assert wait_for_state(rollouts, node, "IDLE", timeout=60)["reason"] is None
        assert not rollouts.lock_exists(node)
    # node03's drain ended, and its install began, after its job ended.
    marks = rollouts.record("slurm-d", "node03")["marks"]
    assert job_end <= float(marks["drained"]) <= float(marks["installed"]), (marks, job_end)
    events = journal_events(rollouts, "slurm-d")
    passes = [e for e in events if e["event"] == "pass"]
    started = next(e["time"] for e in events if e["event"] == "started" and e["node"] == "node03")
    waits = [e for e in events if e["event"] == "waiting" and e.get("node") == "node03"]
    # Its drain runs out of time node_upgrade_drain_timeout_s (300) after the rollout started it.
    assert waits and waits[0]["for"] == "drain" and waits[0]["until"] == pytest.approx(started + 300, abs=1), waits
    # Every pass between its first wait and its job's end went on without node03, and counted it
    # as drain_requested: waiting for the jobs held no worker.
    meanwhile = [p for p in passes if waits[0]["time"] < p["time"] < job_end]
    assert meanwhile and all("node03" not in p["hosts"] for p in meanwhile), (meanwhile, job_end)
    assert all(p["states"].get("drain_requested", 0) >= 1 for p in meanwhile), [p["states"] for p in meanwhile]
    # node03 acted in few passes: its start and drain request, then its install to its verification
    # (and any pass that looked while its drain completed).
    assert 2 <= sum("node03" in p["hosts"] for p in passes) <= 4, [p["hosts"] for p in passes]
    assert passes[-1]["states"] == {"done": 3} and passes[-1]["hosts"] == [], passes[-1]
