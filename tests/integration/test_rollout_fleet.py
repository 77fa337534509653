# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver rollout end to end on a simulated fleet of its own (playbooks/rollout.yml, rollback.yml).

One fleet for the module, seven nodes, every node first on the baseline driver 580.126.20 (R580
LTSB, installed by the driver role). Then, in order:

* ``--check`` changes nothing anywhere;
* bad input (an empty fleet, a missing golden group, a typo in a variable name, a budget of 0)
  refused before any host is touched;
* a rollout of ``driver_branch: ltsb`` over nodes 1-4 (golden node01, canary node02, waves
  node03/node04, node04's drain slow) whose controller is killed in the middle of the waves;
  the re-run resumes node04 and finishes without touching the nodes already done (each node is
  started once in the journal): H100/A100/L40S on the newest R620, the V100 on R580 with the
  report saying why;
* rollback.yml returns the wave (node03, node04) to 580.126.20;
* a lock held by another controller refuses a second rollout on a node;
* faults, five rollouts at once on disjoint nodes (and one sentinel node that none reaches): a module build failure in a wave (node03),
  a GPU lost after the golden node's reboot (node05), a fatal Xid storm during the canary
  pool's soak (node07, after golden node06), a version mismatch after the reboot (golden
  node01) and a reboot that never comes back (golden node02). Each failed node ends on its
  last known-good driver or drained and flagged, its rollout stops there and every other node
  (node04, the wave all of them would reach next) is untouched. The wave case runs with one
  class for both nodes and a failure budget of 0 (zero tolerance), so its first failure stops it.

* a node cut off during its drain (node04 powered off, its reboot hangs): recorded unreachable,
  drained and out of service; the next run leaves it alone; a new rollout takes over the dead
  run's lock and carries it through;
* two rollouts with different targets started at once on node03 and node07 from report
  directories apart (two controllers): exactly one proceeds per node, the other is refused by the
  node's lock; a third beside the first one's directory is refused before any host is touched.

Nodes leave the rollout with their kernel held (node03 has stand-in kernel packages).

Drain uses the ``command`` backend: a marker file per node in the test's directory, so that
"drained" is visible on the controller.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SIMFLEET_DIR = os.path.join(REPO, "tests", "simfleet")
if SIMFLEET_DIR not in sys.path:
    sys.path.append(SIMFLEET_DIR)

from test_driver_kernel_hold import give_node_kernel_packages, upgrades  # noqa: E402
from simfleet.testing import (  # noqa: E402
    FLEET_DRIVER_VARS,
    SimFleet,
    ansible_env,
    baseline_playbook,
    fleet_unavailable,
    make_fleet,
)

pytestmark = pytest.mark.fleet

LAYOUT = "h100,a100,l40s,v100,h100,h100,a100"
BASELINE = "580.126.20"
ROLLOUT = os.path.join(REPO, "playbooks", "rollout.yml")
ROLLBACK = os.path.join(REPO, "playbooks", "rollback.yml")

# Variables of every rollout test fleet: the fleet's signed repository, drain markers in the
# test's directory, short reboot and rescue timeouts.
INVENTORY_VARS = "all:\n  vars:\n" + FLEET_DRIVER_VARS + """\
    node_upgrade_drain: command
    node_upgrade_drain_command: [touch, "%(dir)s/drained/{{ inventory_hostname }}"]
    node_upgrade_undrain_command: [rm, -f, "%(dir)s/drained/{{ inventory_hostname }}"]
    node_upgrade_reboot_timeout_s: %(reboot_timeout_s)d
    node_upgrade_rescue_connect_timeout_s: 15
"""

INVENTORY = INVENTORY_VARS + """\
  children:
    gpu_h100:
      vars:
        gpu_policy_persistence_mode: true
        gpu_policy_power_limit_w: 600
        gpu_policy_compute_mode: default
    gpufleet_golden:
      hosts:
        node01:
    gpufleet_canary:
      hosts:
        node02:
    golden_b:
      hosts:
        node05:
    golden_c:
      hosts:
        node06:
    canary_c:
      hosts:
        node07:
    slow_drain:
      hosts:
        node04:
      vars:
        node_upgrade_drain_command: [sh, -c, "sleep 25; touch %(dir)s/drained/{{ inventory_hostname }}"]
"""

BASELINE_PLAYBOOK = baseline_playbook(BASELINE)


#: The environment variable that marks every process a run starts: the environment is inherited
#: through fork, exec and setsid, so a worker or an SSH master in a session of its own keeps it.
RUN_MARK = "GPUFLEET_TEST_RUN"


def processes_of(marks):
    """Pids of the processes (this one excepted) whose environment holds ``GPUFLEET_TEST_RUN=<mark>``
    for one of ``marks``, read from ``/proc/<pid>/environ``."""
    needles = set(("%s=%s" % (RUN_MARK, mark)).encode() for mark in marks)
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if needles.intersection(environ):
            found.append(int(pid))
    return found


def reap(marks, timeout=30):
    """SIGKILL every process of ``marks`` until none is left or ``timeout`` seconds have passed;
    returns the pids still there (empty when all are gone)."""
    deadline = time.time() + timeout
    left = processes_of(marks)
    while left and time.time() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)
        left = processes_of(marks)
    return left


class Rollouts(object):
    """The fleet and the test's directory (inventory additions, drain markers, reports)."""

    def __init__(self, fleet, workdir, inventory=INVENTORY, reboot_timeout_s=90, env=None):
        self.fleet = fleet
        self.dir = workdir
        self.env = env
        self.marks = []
        self.inventory = os.path.join(workdir, "rollout-inventory.yml")
        os.makedirs(os.path.join(workdir, "drained"), exist_ok=True)
        with open(self.inventory, "w") as handle:
            handle.write(inventory % {"dir": workdir, "reboot_timeout_s": reboot_timeout_s})

    def argv(self, playbook, *extra):
        tool = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
        return [tool, "-i", self.fleet.inventory, "-i", self.inventory, playbook] + list(extra)

    def start(self, playbook, *extra):
        """Start ``ansible-playbook``; every process it starts carries the run's mark (:func:`processes_of`)."""
        stamp = time.time_ns()
        log = open(os.path.join(self.dir, "run-%d.log" % stamp), "w")
        mark = "%s:%d" % (self.dir, stamp)
        self.marks.append(mark)
        env = ansible_env(dict(self.env or {}, **{RUN_MARK: mark}))
        proc = subprocess.Popen(self.argv(playbook, *extra), env=env, cwd=self.dir, stdout=log,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        proc.mark = mark
        return proc, log.name

    def run(self, playbook, *extra, timeout=1800):
        proc, log = self.start(playbook, *extra)
        proc.wait(timeout=timeout)
        with open(log) as handle:
            return proc.returncode, handle.read()

    def rollout(self, rollout_id, hosts, *extra, start=False, concurrent=False):
        """Run (or ``start``) a rollout; ``concurrent``: rollouts started together that share a sentinel node."""
        args = ["-e", "driver_branch=ltsb", "-e", "rollout_id=%s" % rollout_id, "-e", "rollout_hosts=%s" % hosts,
                "-e", "rollout_report_dir=%s" % self.report_dir(rollout_id), "-e", "rollout_soak_s=0",
                "-e", "rollout_allow_no_golden=true", "-e", "rollout_allow_no_canary=true"] + list(extra)
        if concurrent:
            args += ["-e", "rollout_allow_concurrent=true"]
        return self.start(ROLLOUT, *args) if start else self.run(ROLLOUT, *args)

    def started(self, rollout_id):
        """How many times the rollout's journal started each node."""
        counts = {}
        with open(os.path.join(self.report_dir(rollout_id), "journal.jsonl")) as handle:
            for line in handle:
                event = json.loads(line)
                if event["event"] == "started":
                    counts[event["node"]] = counts.get(event["node"], 0) + 1
        return counts

    def report_dir(self, rollout_id):
        return os.path.join(self.dir, "reports", rollout_id)

    def kernel_held(self, node):
        """The kernel_hold role's record on the node (None when absent) and the unattended-upgrades blacklist."""
        out = self.fleet.run(node, "cat /etc/ansible/facts.d/gpufleet_kernel_hold.fact").stdout
        blacklist = self.fleet.run(node, "test -e /etc/apt/apt.conf.d/51gpufleet-kernel-hold").returncode == 0
        return (json.loads(out) if out.strip() else None), blacklist

    def clear(self, node):
        """Clear a node's faults, rollout flag and drain mark (an operator's work once a failure is understood)."""
        self.fleet.fault(node, "clear")
        self.fleet.run(node, "rm -f /etc/ansible/facts.d/gpufleet_rollout.fact", check=True)
        marker = os.path.join(self.dir, "drained", node)
        if os.path.exists(marker):
            os.unlink(marker)

    def report(self, rollout_id):
        with open(os.path.join(self.report_dir(rollout_id), "rollout-report.json")) as handle:
            return json.load(handle)

    def record(self, rollout_id, node):
        path = os.path.join(self.report_dir(rollout_id), "nodes", node + ".json")
        if not os.path.exists(path):
            return None
        with open(path) as handle:
            return json.load(handle)

    def kill(self, proc):
        """Kill a controller as a crash would (SIGKILL to its process group), then every process its run
        started: an ansible worker or an SSH master in a session of its own survives the group's kill
        and would go on against the fleet. Asserts that none is left; returns how many processes the
        run had (``found``) and how many of them were outside the controller's session (``other_sessions``)."""
        found = processes_of([proc.mark])
        other_sessions = []
        for pid in found:
            try:
                if os.getsid(pid) != proc.pid:
                    other_sessions.append(pid)
            except OSError:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        left = reap([proc.mark])
        assert not left, "processes of the killed run still alive: %s" % left
        return {"found": len(found), "other_sessions": len(other_sessions)}

    def reap(self):
        """End every process any run of this handle started (SSH masters left by runs that ended
        included); asserts that none is left."""
        left = reap(self.marks)
        assert not left, "processes of this test's runs still alive: %s" % left

    def sh(self, node, command):
        return self.fleet.run(node, command, check=True).stdout

    def state(self, node):
        """What must not move on an untouched node: versions, holds, boot, rollout files, drain."""
        return {
            "packages": self.sh(node, "dpkg-query -W -f='${Package}=${Version} ${db:Status-Abbrev}\\n' "
                                      "'nvidia-*' 'libnvidia-*' 'libcuda*' 2>/dev/null | sort"),
            "held": self.sh(node, "apt-mark showhold | sort"),
            "loaded": self.loaded(node),
            "boot_id": self.fleet.boot_id(node),
            "rollout_files": self.sh(node, "ls /var/lib/gpufleet/rollout /etc/ansible/facts.d 2>/dev/null || true"),
            "drained": self.drained(node),
        }

    def loaded(self, node):
        return self.sh(node, "cat /sys/module/nvidia/version 2>/dev/null || true").strip()

    def userspace(self, node):
        return self.sh(node, "dpkg-query -W -f='${Version}' libnvidia-ml1").strip().rsplit("-", 1)[0]

    def drained(self, node):
        return os.path.exists(os.path.join(self.dir, "drained", node))

    def flag(self, node):
        out = self.fleet.run(node, "cat /etc/ansible/facts.d/gpufleet_rollout.fact").stdout
        return json.loads(out) if out.strip() else None

    def lock_exists(self, node):
        return self.fleet.run(node, "test -e /var/lib/gpufleet/rollout/lock.json").returncode == 0


def rollout_fleet(tmp_path_factory, name, ports, layout, slurm=False, handle_class=None, **rollouts_args):
    """Bring up a fleet of ``layout`` with every node on the baseline driver; yield its Rollouts.

    ``name`` and ``ports`` may be overridden by ``<NAME>_FLEET`` / ``<NAME>_PORTS`` in the
    environment (``name`` upper-cased, ``-`` → ``_``). ``slurm``: the fleet runs its Slurm cluster and
    the runs find its command wrappers first in ``PATH``. ``handle_class``: the Rollouts class to
    yield (default Rollouts). The fleet is purged afterwards unless ``SIMFLEET_TEST_KEEP=1``.
    """
    reason = fleet_unavailable()
    if reason:
        pytest.skip(reason)
    env = name.upper().replace("-", "_")
    fleet = make_fleet(os.environ.get(env + "_FLEET") or name, None, layout, os.environ.get(env + "_PORTS") or ports,
                       slurm=slurm)
    try:
        if slurm:
            rollouts_args.setdefault("env", {"PATH": fleet.slurm().bin_dir + os.pathsep + ansible_env()["PATH"]})
        handle = (handle_class or Rollouts)(SimFleet(fleet), str(tmp_path_factory.mktemp(name)), **rollouts_args)
        baseline = os.path.join(handle.dir, "baseline.yml")
        with open(baseline, "w") as out:
            out.write(BASELINE_PLAYBOOK)
        code, log = handle.run(baseline, "-f", "12")
        assert code == 0, log[-4000:]
        yield handle
        handle.reap()
    finally:
        if os.environ.get("SIMFLEET_TEST_KEEP") != "1":
            fleet.down(purge=True)


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    yield from rollout_fleet(tmp_path_factory, "rollout-test", "24300-24399", LAYOUT)


def assert_on(rollouts, node, version):
    assert rollouts.userspace(node) == version
    assert rollouts.loaded(node) == version


def test_check_mode_changes_nothing(rollouts):
    nodes = ["node01", "node02", "node03", "node04"]
    before = dict((node, rollouts.state(node)) for node in nodes)
    code, log = rollouts.run(ROLLOUT, "--check", "-e", "driver_branch=ltsb", "-e", "rollout_id=check",
                             "-e", "rollout_hosts=node01:node02:node03:node04",
                             "-e", "rollout_report_dir=%s" % rollouts.report_dir("check"))
    assert code == 0, log[-4000:]
    assert "node01 (golden): would drain (command), install 620.82.01, reboot, verify and return to service" in log
    assert "node04 (waves): would drain (command), install 580.178.04" in log
    for node in nodes:
        assert rollouts.state(node) == before[node], node
    assert not os.path.exists(rollouts.report_dir("check"))


def test_bad_input_is_refused_before_any_host_is_touched(rollouts):
    nodes = ["node01", "node02", "node03", "node04"]
    before = dict((node, rollouts.state(node)) for node in nodes)
    base = ["-e", "driver_branch=ltsb", "-e", "rollout_id=bad", "-e", "rollout_report_dir=%s" % rollouts.report_dir("bad")]
    cases = [
        (["-e", "rollout_hosts=nothing_here"], "the rollout matches no host"),
        (["-e", "rollout_hosts=node03:node04"], "the golden stage has no host"),
        (["-e", "rollout_hosts=node01:node02:node03:node04", "-e", "driver_brnach=620"],
         "unknown variable driver_brnach (did you mean driver_branch?)"),
        (["-e", "rollout_hosts=node01:node02:node03:node04", "-e", "node_upgrade_drian=slurm"],
         "unknown variable node_upgrade_drian (did you mean node_upgrade_drain?)"),
        # node_upgrade's argument spec, checked for every node at the plan (not on each node's turn).
        (["-e", "rollout_hosts=node01:node02:node03:node04", "-e", "node_upgrade_drain=slurmx"],
         "node01: value of node_upgrade_drain must be one of: none, slurm, slurm_reboot, kubernetes, command, got: slurmx"),
        (["-e", "rollout_hosts=node01:node02:node03:node04", "-e", "rollout_max_unavailable=0"],
         "rollout_max_unavailable must be at least 1, got '0'"),
        (["-e", "rollout_hosts=node01:node02:node03:node04", "-e", "rollout_max_unavailable=-50%"],
         "rollout_max_unavailable must be a count (at least 1) or a percentage such as 10%, got '-50%'"),
        (["-e", "rollout_hosts=node01:node02:node03:node04", "-e", "rollout_max_unavailable=150%"],
         "rollout_max_unavailable must be at most 100%, got '150%'"),
        (["-e", "rollout_hosts=node01:node02:node03:node04", "-e", "rollout_executor=pass"],
         "rollout_executor must be one of steps, passes, got 'pass'"),
        (["-e", "rollout_hosts=node01:node02:node03:node04", "-e", "rollout_passes=61", "-e", "rollout_pass_s=soon"],
         "rollout_pass_s must be more than 0 and at most 86400 seconds, got 'soon'; rollout_passes must be a whole "
         "number from 1 to 60 (the passes rollout.yml holds), got '61'"),
    ]
    for extra, words in cases:
        code, log = rollouts.run(ROLLOUT, *(base + extra))
        assert code != 0, (extra, log[-2000:])
        assert "rollout refused before any host was touched" in log and words in log, (extra, log[-3000:])
    for node in nodes:
        assert rollouts.state(node) == before[node], node
    assert not os.path.exists(os.path.join(rollouts.report_dir("bad"), "journal.jsonl"))


def benchmark_waiting_after_reboot(node, version):
    """A ``node_upgrade_benchmark_command`` (run before the install and after the reboot) that, on
    ``node`` once it has rebooted into ``version``, waits 300 s, once (the mark
    ``/run/gpufleet-bench-waited`` lives until the next boot): the controller can be stopped there,
    with the node on target, still drained, not verified, its lock held. Elsewhere it prints 100."""
    return ["sh", "-c", 'if [ "$(hostname)" = %s ] && [ "$(cat /sys/module/nvidia/version)" = %s ] '
                        '&& mkdir /run/gpufleet-bench-waited 2>/dev/null; then sleep 300; fi; echo 100'
            % (node, version)]


WAIT_AFTER_REBOOT = json.dumps({"node_upgrade_benchmark_command": benchmark_waiting_after_reboot("node04", "580.178.04")})


def test_rollout_killed_in_a_wave_resumes_without_redoing_nodes(rollouts, tmp_path):
    kernel = give_node_kernel_packages(rollouts.fleet, "node03", tmp_path)
    assert "linux-image-%s" % kernel not in rollouts.sh("node03", "apt-mark showhold").split()
    proc, log = rollouts.rollout("ltsb", "node01:node02:node03:node04", "-e", WAIT_AFTER_REBOOT, start=True)
    killed = False
    deadline = time.time() + 1500
    while time.time() < deadline and proc.poll() is None:
        node03 = rollouts.record("ltsb", "node03")
        if node03 and node03["result"] == "upgraded" and rollouts.fleet.run(
                "node04", "test -d /run/gpufleet-bench-waited").returncode == 0:
            killed = rollouts.kill(proc)
            break
        time.sleep(1)
    proc.wait(timeout=60)
    assert killed, "the first run ended before node04 rebooted: %s" % open(log).read()[-3000:]
    # The run had its workers and their SSH connections; none outlived the kill (Rollouts.kill asserts it).
    assert killed["found"] > 1, killed
    print("killed run: %(found)d processes, %(other_sessions)d outside the controller's session" % killed)
    # The killed step rendered no report; its records and journal say where it was: node04 in flight,
    # already on its new driver, drained and locked.
    assert rollouts.record("ltsb", "node04") is None
    assert rollouts.loaded("node04") == "580.178.04"
    assert rollouts.drained("node04") and rollouts.lock_exists("node04")
    assert rollouts.started("ltsb") == {"node01": 1, "node02": 1, "node03": 1, "node04": 1}
    first_run = rollouts.record("ltsb", "node01")["run_id"]

    code, out = rollouts.rollout("ltsb", "node01:node02:node03:node04")
    assert code == 0, out[-4000:]
    report = rollouts.report("ltsb")
    assert report["status"] == "completed"
    assert report["summary"]["upgraded"] == 4
    by_node = dict((n["node"], n) for n in report["nodes"])
    # Nodes finished by the killed run keep their record and are not touched again; node04, in
    # flight when the controller died, is resumed (not started a second time).
    for node in ("node01", "node02", "node03"):
        assert by_node[node]["run_id"] == first_run
        assert "confirmed_by_run" not in by_node[node]
        assert by_node[node]["before"]["loaded"] == BASELINE
    assert by_node["node04"]["run_id"] != first_run
    # node04 is on target after the killed run: finished (verified, undrained, lock released), not skipped.
    assert by_node["node04"]["result"] == "upgraded" and by_node["node04"]["resumed"] is True
    assert by_node["node04"]["before"]["loaded"] == BASELINE
    assert "resumed an interrupted attempt" in by_node["node04"]["reason"]
    assert rollouts.started("ltsb") == {"node01": 1, "node02": 1, "node03": 1, "node04": 1}
    assert by_node["node01"]["stage"] == "golden" and by_node["node02"]["stage"] == "canary"
    assert by_node["node04"]["stage"] == "waves"
    # H100, A100, L40S: the newest R620; V100: the newest R580, and the report says why.
    for node in ("node01", "node02", "node03"):
        assert_on(rollouts, node, "620.82.01")
    assert_on(rollouts, "node04", "580.178.04")
    assert "node04: ltsb resolves to R580 for Volta: R620, the newest LTSB, does not support Volta" in report["notes"]
    for node in ("node01", "node02", "node03", "node04"):
        held = rollouts.sh(node, "apt-mark showhold").split()
        assert "libnvidia-ml1" in held
        assert {"nvidia-kernel-open-dkms", "nvidia-kernel-dkms"} & set(held)
        assert not rollouts.drained(node)
        assert rollouts.flag(node) is None
        assert not rollouts.lock_exists(node)
        local = json.loads(rollouts.sh(node, "cat /etc/ansible/facts.d/gpufleet_driver.fact"))
        assert local["last_known_good"]["version"] == rollouts.userspace(node)
        # A node leaves the rollout with its kernel held, as the driver role holds the driver.
        record, blacklist = rollouts.kernel_held(node)
        assert record["running_kernel"] == kernel and blacklist, (node, record)
    held = set(rollouts.sh("node03", "apt-mark showhold").split())
    assert {"linux-image-%s" % kernel, "linux-image-amd64"} <= held
    assert "linux-image-amd64" not in upgrades(rollouts.fleet, "node03")  # the newer kernel is not taken
    # The H100 policy is in effect after the reboot.
    policy = json.loads(rollouts.sh("node01", "cat /var/lib/gpufleet/gpu_policy/report.json"))
    assert all(gpu["in_effect"]["power_limit_w"] == 600.0 and gpu["in_effect"]["persistence_mode"] is True
               for gpu in policy)
    markdown = open(os.path.join(rollouts.report_dir("ltsb"), "rollout-report.md")).read()
    assert "Status: **completed**." in markdown
    assert "| node04 | waves | upgraded | 580.126.20 | 580.178.04 | 580.178.04 |" in markdown


def test_a_journal_line_cut_by_a_crash_loses_only_itself(rollouts):
    """The journal's last line cut mid-write (a controller killed, a full disk): the next run of the same
    rollout loses that line alone, counts it in the report, resumes the node it named, and every node
    ends as it would have."""
    path = os.path.join(rollouts.report_dir("ltsb"), "journal.jsonl")
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    # The crash came while the last event about a node was written: that line half there, nothing after it.
    last = max(i for i, line in enumerate(lines) if b'"node"' in line)
    with open(path, "wb") as handle:
        handle.write(b"\n".join(lines[:last] + [lines[last][:len(lines[last]) // 2]]))
    code, out = rollouts.rollout("ltsb", "node01:node02:node03:node04")
    assert code == 0, out[-4000:]
    report = rollouts.report("ltsb")
    assert report["status"] == "completed"
    assert report["journal"]["lost_lines"] == 1, report["journal"]
    assert report["journal"]["ambiguous"] == []  # the node the cut line named was resumed and recorded
    assert sorted(n["node"] for n in report["nodes"] if n["result"] in ("upgraded", "skipped")) == [
        "node01", "node02", "node03", "node04"]
    markdown = open(os.path.join(rollouts.report_dir("ltsb"), "rollout-report.md")).read()
    assert "## Journal" in markdown
    # Every line after the cut one is whole: the appends began on a line of their own.
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")

    def whole(line):
        try:
            return isinstance(json.loads(line), dict)
        except ValueError:
            return False

    cut = [i for i, line in enumerate(lines) if line and not whole(line)]
    assert len(cut) == 1 and all(whole(line) for line in lines[cut[0] + 1:] if line), cut
    for node in ("node01", "node02", "node03"):
        assert_on(rollouts, node, "620.82.01")
    assert_on(rollouts, "node04", "580.178.04")


def test_rollback_playbook_returns_a_wave(rollouts):
    untouched = dict((node, rollouts.state(node)) for node in ("node01", "node02"))
    code, log = rollouts.run(ROLLBACK, "-e", "rollback_hosts=node03:node04", "-e", "rollback_id=wave",
                             "-e", "rollback_report_dir=%s" % rollouts.report_dir("wave-rollback"))
    assert code == 0, log[-4000:]
    for node in ("node03", "node04"):
        assert_on(rollouts, node, BASELINE)
        assert not rollouts.drained(node)
        assert rollouts.flag(node) is None
    records = dict((n["node"], n) for n in rollouts.report("wave-rollback")["nodes"])
    assert records["node03"]["result"] == "rolled_back"
    assert records["node03"]["before"]["loaded"] == "620.82.01"
    assert records["node04"]["before"]["loaded"] == "580.178.04"
    for node, state in untouched.items():
        assert rollouts.state(node) == state


def test_lock_of_another_controller_refuses_a_second_rollout(rollouts):
    lock = {"rollout_id": "other", "run_id": "elsewhere-1-1", "controller": "another-controller", "pid": 4242,
            "acquired_at": time.time()}
    rollouts.fleet.run("node04", "mkdir -p /var/lib/gpufleet/rollout && cat > /var/lib/gpufleet/rollout/lock.json",
                       check=True, input=json.dumps(lock))
    before = rollouts.state("node04")
    code, log = rollouts.rollout("locked", "node04")
    assert code == 2, log[-3000:]
    record = rollouts.record("locked", "node04")
    assert record["result"] == "refused"
    assert "locked by rollout other (run elsewhere-1-1, controller another-controller, pid 4242)" in record["reason"]
    assert rollouts.state("node04") == before
    rollouts.fleet.run("node04", "rm -f /var/lib/gpufleet/rollout/lock.json", check=True)


def test_a_lock_from_another_controller_is_judged_by_its_lease(rollouts):
    # node02 is on target since the wave test. Its lock names a run of another controller (the
    # next AWX job's container is another host) and that run's lease in a report directory.
    lease = os.path.join(rollouts.dir, "reports", "other", "runs", "awx-1-1.lease")
    os.makedirs(os.path.dirname(lease), exist_ok=True)
    with open(lease, "w") as handle:
        json.dump({"run_id": "awx-1-1", "controller": "automation-job-4711", "pid": 1, "awx_job_id": "4711"}, handle)
    lock = {"rollout_id": "other", "run_id": "awx-1-1", "controller": "automation-job-4711", "pid": 1,
            "acquired_at": time.time() - 7 * 3600, "lease": lease, "awx_job_id": "4711"}
    rollouts.fleet.run("node02", "cat > /var/lib/gpufleet/rollout/lock.json", check=True, input=json.dumps(lock))
    # Held for 7 hours, more than node_upgrade_lock_stale_s (6 h), but its lease is renewed: refused.
    code, log = rollouts.rollout("leased", "node02")
    assert code == 2, log[-3000:]
    record = rollouts.record("leased", "node02")
    assert record["result"] == "refused"
    assert "locked by rollout other (run awx-1-1, controller automation-job-4711, pid 1) (AWX job 4711)" \
        in record["reason"]
    assert rollouts.lock_exists("node02")
    # The job was cancelled: its lease is no longer renewed. The lock is taken over and released,
    # and the node, on target, is skipped.
    os.utime(lease, (time.time() - 3600, time.time() - 3600))
    code, log = rollouts.rollout("leased-2", "node02")
    assert code == 0, log[-3000:]
    assert "took over the lock of rollout other (run awx-1-1, controller automation-job-4711, pid 1) (AWX job " \
           "4711): that run is gone" in log
    assert "not renewed for 3" in log and "(stale after 300 s)" in log
    assert rollouts.record("leased-2", "node02")["result"] == "skipped"
    assert not rollouts.lock_exists("node02")


def test_unresolvable_target_is_refused_at_preflight_with_no_node_drained(rollouts):
    before = rollouts.state("node04")
    code, log = rollouts.rollout("unresolvable", "node04", "-e", "driver_branch=620")
    assert code == 2, log[-3000:]
    record = rollouts.record("unresolvable", "node04")
    assert record["result"] == "refused" and "resolution" in record["flags"], record
    assert "Volta" in record["reason"], record["reason"]
    assert not rollouts.drained("node04")
    assert rollouts.state("node04") == before


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError("timed out waiting for %s" % what)


def assert_recovered(rollouts, rollout_id, node, lkg):
    """The failed node ends on its last known-good driver or drained and flagged; the rollout stopped."""
    report = rollouts.report(rollout_id)
    assert report["status"] == "stopped"
    assert [s["node"] for s in report["stopped_by"]] == [node]
    record = rollouts.record(rollout_id, node)
    assert record["result"] in ("rolled_back", "flagged")
    on_lkg = rollouts.fleet.boot_id(node) is not None and rollouts.loaded(node) == lkg
    assert on_lkg or (rollouts.drained(node) and record["flag"]["flagged"]), record
    assert rollouts.drained(node)
    if rollouts.fleet.boot_id(node) is not None:
        assert rollouts.flag(node)["rollout_id"] == rollout_id
    return record


def test_five_fault_kinds_at_golden_in_the_canary_pool_and_in_a_wave(rollouts):
    """Five rollouts at once on disjoint nodes, each with one fault; node04 is the wave that none reaches."""
    fleet = rollouts.fleet
    untouched = rollouts.state("node04")
    fleet.fault("node03", "build_fail", version="620.82.01")
    fleet.fault("node05", "gpu_lost", gpu="2")
    fleet.fault("node01", "version_mismatch")
    fleet.fault("node02", "reboot_hang")
    # node04 is a wave node of all five rollouts at once: drained ahead, one rollout would lock it
    # and the others be refused there, so these run with one admission per node (a stop's release
    # of the nodes drained ahead: test_rollout_scale.py).
    one = ("-e", "rollout_drain_ahead=false")
    procs = [
        # Wave, one class for both nodes and zero tolerance: node03 fails to build the module; node04,
        # waiting for the class's only slot, never starts.
        rollouts.rollout("f-wave", "node03:node04", "-e", "rollout_class_prefix=none_",
                         "-e", "rollout_failure_budget=0", *one, start=True, concurrent=True)[0],
        # Golden: a GPU falls off the bus at the reboot.
        rollouts.rollout("f-golden", "node05:node04", "-e", "rollout_golden_group=golden_b", *one, start=True,
                         concurrent=True)[0],
        # Canary: golden node06 passes; a fatal Xid storm hits canary node07 during its soak.
        rollouts.rollout("f-canary", "node06:node07:node04", "-e", "rollout_golden_group=golden_c",
                         "-e", "rollout_canary_group=canary_c", "-e", "rollout_soak_s=40", *one, start=True,
                         concurrent=True)[0],
        # Golden node01 (on 620.82.01, going to 620.70.06): the module loaded after the reboot is not the one
        # installed. Golden node02: its reboot never comes back.
        rollouts.rollout("f-mismatch", "node01:node04", "-e", "driver_version=620.70.06", *one, start=True,
                         concurrent=True)[0],
        rollouts.rollout("f-hang", "node02:node04", "-e", "driver_version=620.70.06",
                         "-e", "rollout_golden_group=gpufleet_canary", "-e", "rollout_canary_group=none", *one,
                         start=True, concurrent=True)[0],
    ]
    wait_for(lambda: (rollouts.record("f-canary", "node07") or {}).get("result") == "upgraded", 1200,
             "the canary node07 to be upgraded")
    fleet.fault("node07", "xid_storm", xid="48", count="5", gpu="1")
    codes = [proc.wait(timeout=1500) for proc in procs]
    # Each rollout fails its host and stops (2); the hung node may also be counted unreachable (4).
    assert codes[:4] == [2, 2, 2, 2] and codes[4] in (2, 4), codes

    record = assert_recovered(rollouts, "f-wave", "node03", BASELINE)
    assert "apt-get failed" in record["reason"]
    assert record["flags"] == ["transaction_failed"]
    # A failed module build leaves the new set half-configured and the old pinning package removed but
    # held again; the rollback releases those holds and puts the node back on its known-good driver.
    assert record["result"] == "rolled_back", record
    assert_on(rollouts, "node03", BASELINE)
    assert rollouts.report("f-wave")["summary"]["not_started"] == 1

    record = assert_recovered(rollouts, "f-golden", "node05", BASELINE)
    assert "gpu_unreadable" in record["flags"] or "gpu_count_changed" in record["flags"]

    record = assert_recovered(rollouts, "f-canary", "node07", BASELINE)
    assert "new fatal Xid during the soak: Xid 48" in record["reason"]
    # node07 passed its verification on 620.82.01 before the soak failed: once rolled back, the version
    # that failed is no longer its last known-good.
    assert record["result"] == "rolled_back", record
    local = json.loads(rollouts.sh("node07", "cat /etc/ansible/facts.d/gpufleet_driver.fact"))
    assert local["last_known_good"]["version"] == BASELINE
    assert rollouts.record("f-canary", "node06")["result"] == "upgraded"
    assert_on(rollouts, "node06", "620.82.01")

    record = assert_recovered(rollouts, "f-mismatch", "node01", "620.82.01")
    assert "version_not_loaded" in record["flags"]

    record = rollouts.record("f-hang", "node02")
    assert record["result"] == "flagged"
    assert "does not answer" in record["reason"]
    assert rollouts.drained("node02")
    assert rollouts.report("f-hang")["status"] == "stopped"

    for rollout_id in ("f-wave", "f-golden", "f-canary", "f-mismatch", "f-hang"):
        assert rollouts.record(rollout_id, "node04") is None
    assert rollouts.state("node04") == untouched
    fleet.fault("node02", "clear")


def test_a_gpu_replaced_by_an_rma_returns_the_node_only_where_its_slot_is_named(rollouts):
    """node05 lost GPU 2 in the golden rollout above and stays drained and flagged; its card is replaced.

    The new card has a new UUID and serial: rollback.yml alone refuses it (not the GPU of the snapshot);
    with the slot named (rollback_replaced_gpus, as the node's next step says), the node is verified on
    its known-good driver, its flag cleared and it is back in service."""
    node = "node05"
    assert rollouts.flag(node) is not None and rollouts.drained(node)
    state = json.loads(rollouts.sh(node, "cat /var/lib/simgpu/state.json"))
    bus = state["gpus"][2]["pci"]["bus_id"]
    old = (state["gpus"][2]["uuid"], state["gpus"][2]["serial"])
    step = [n for n in rollouts.report("f-golden")["nodes"] if n["node"] == node][0]["next_step"]
    assert "-e rollback_hosts=node05 -e rollback_replaced_gpus=%s" % bus.lower()[4:] in step["clears"], step
    # A slot that is no PCI bus id is refused before the node is touched.
    boot = rollouts.fleet.boot_id(node)
    code, log = rollouts.run(ROLLBACK, "-e", "rollback_hosts=%s" % node, "-e", "rollback_id=rma-bad",
                             "-e", "rollback_report_dir=%s" % rollouts.report_dir("rma-bad"),
                             "-e", "rollback_replaced_gpus=%s,slot2" % bus)
    assert code != 0 and "each entry must be a PCI bus id such as 0000:3b:00.0, got ['slot2']" in log, log[-3000:]
    assert rollouts.fleet.boot_id(node) == boot and rollouts.record("rma-bad", node) is None
    rollouts.fleet.fault(node, "gpu_replaced", gpu="2")
    new = json.loads(rollouts.sh(node, "cat /var/lib/simgpu/state.json"))["gpus"][2]
    assert (new["uuid"], new["serial"]) != old

    code, log = rollouts.run(ROLLBACK, "-e", "rollback_hosts=%s" % node, "-e", "rollback_id=rma-unnamed",
                             "-e", "rollback_report_dir=%s" % rollouts.report_dir("rma-unnamed"))
    assert code == 2, log[-4000:]
    record = rollouts.record("rma-unnamed", node)
    assert "gpu_identity_changed" in record["flags"], record
    assert old[0] in record["reason"] and new["uuid"] in record["reason"]
    assert rollouts.flag(node) is not None and rollouts.drained(node)

    # As an extra var arrives (a string) and in NVML's form of the bus id.
    code, log = rollouts.run(ROLLBACK, "-e", "rollback_hosts=%s" % node, "-e", "rollback_id=rma-named",
                             "-e", "rollback_report_dir=%s" % rollouts.report_dir("rma-named"),
                             "-e", "rollback_replaced_gpus=%s" % bus)
    assert code == 0, log[-4000:]
    record = rollouts.record("rma-named", node)
    assert record["result"] == "rolled_back", record
    assert_on(rollouts, node, BASELINE)
    assert rollouts.flag(node) is None
    assert not rollouts.drained(node)
    print("replaced GPU at %s: %s (serial %s) -> %s (serial %s)" % (bus, old[0], old[1], new["uuid"], new["serial"]))


def test_node_cut_off_mid_transaction_is_recorded_and_stays_out_of_service(rollouts):
    """node04's power goes during its (slow) drain: the transaction cannot go on, its rescue never runs."""
    fleet = rollouts.fleet
    proc, log = rollouts.rollout("cutoff", "node04", start=True)
    # Its drain record is written just before the drain command (a 25 s sleep on the controller).
    wait_for(lambda: rollouts.fleet.run("node04", "test -e /var/lib/gpufleet/rollout/drain.json").returncode == 0, 600,
             "node04 to record its drain")
    fleet.fault("node04", "reboot_hang")
    assert fleet.reboot("node04") is None  # down, and it stays down
    code = proc.wait(timeout=900)
    out = open(log).read()
    assert code == 4, out[-4000:]  # a host was unreachable
    record = rollouts.record("cutoff", "node04")
    assert record["result"] == "unreachable" and record["flags"] == ["unreachable"], record
    assert record["reason"].startswith("the node stopped answering after its drain; its transaction did not finish: "
                                       "left drained and locked, without a flag; out of service"), record["reason"]
    assert record["drained"] is True and record["target"]["version"] == "580.178.04"
    report = rollouts.report("cutoff")
    assert [q["node"] for q in report["quarantined"]] == ["node04"]
    assert report["summary"]["unreachable"] == 1
    assert rollouts.drained("node04")
    # It comes back: still drained and locked (a person looks at it first); the next run of the
    # rollout leaves it alone and keeps it out of service.
    fleet.fault("node04", "clear")
    wait_for(lambda: fleet.boot_id("node04") is not None and fleet.run("node04", "true").returncode == 0, 300,
             "node04 to boot again")
    assert rollouts.lock_exists("node04")
    before = rollouts.state("node04")
    code, out = rollouts.rollout("cutoff", "node04")
    assert code == 0, out[-4000:]
    assert rollouts.started("cutoff") == {"node04": 1}
    assert rollouts.record("cutoff", "node04")["result"] == "unreachable"
    assert rollouts.state("node04") == before
    budgets = rollouts.report("cutoff")["budgets"]["gpu_v100"]
    assert budgets["out_of_service"] == 1, budgets
    # Once looked at, a new rollout takes over the dead run's lock and carries the node through.
    code, out = rollouts.rollout("cutoff-retry", "node04")
    assert code == 0, out[-4000:]
    assert rollouts.record("cutoff-retry", "node04")["result"] == "upgraded"
    assert_on(rollouts, "node04", "580.178.04")
    assert not rollouts.lock_exists("node04") and not rollouts.drained("node04")


def test_two_rollouts_at_once_on_the_same_nodes_one_proceeds_per_node(rollouts):
    """Two controllers (report directories apart) roll different targets onto node03 and node07 at once."""
    for node in ("node03", "node07"):
        rollouts.clear(node)
        assert_on(rollouts, node, BASELINE)
    targets = {"ctl-a": "580.178.04", "ctl-b": "620.82.01"}
    dirs = dict((name, os.path.join(rollouts.dir, name, "conc-" + name)) for name in targets)
    both = ["-e", "rollout_class_prefix=none_", "-e", "rollout_window_initial=2", "-e", "rollout_max_unavailable=100%"]
    procs = dict((name, rollouts.rollout("conc-" + name, "node03:node07", "-e", "driver_version=%s" % version,
                                         "-e", "rollout_report_dir=%s" % dirs[name], *both, start=True))
                 for name, version in targets.items())
    # A third rollout beside the first one's report directory is refused before any host is touched.
    wait_for(lambda: os.path.exists(os.path.join(dirs["ctl-a"], "journal.jsonl")), 300, "ctl-a to start a node")
    third = os.path.join(rollouts.dir, "ctl-a", "conc-third")
    code, out = rollouts.rollout("conc-third", "node07", "-e", "driver_version=620.70.06",
                                 "-e", "rollout_report_dir=%s" % third)
    refusal = "rollout refused before any host was touched: rollout conc-ctl-a is running on 1 of these nodes (node07; run "
    assert code != 0 and refusal in out, out[-3000:]
    assert not os.path.exists(os.path.join(third, "journal.jsonl"))
    for proc, _log in procs.values():
        proc.wait(timeout=1200)
    for node in ("node03", "node07"):
        results = {}
        for name in targets:
            with open(os.path.join(dirs[name], "nodes", node + ".json")) as handle:
                results[name] = json.load(handle)
        winners = [name for name, r in results.items() if r["result"] == "upgraded"]
        assert len(winners) == 1, (node, dict((n, (r["result"], r["reason"])) for n, r in results.items()))
        loser = [name for name in targets if name not in winners][0]
        assert results[loser]["result"] == "refused" and "locked" in results[loser]["flags"], results[loser]
        assert "another rollout" in results[loser]["reason"], results[loser]["reason"]
        assert_on(rollouts, node, targets[winners[0]])
        assert not rollouts.lock_exists(node) and not rollouts.drained(node)
