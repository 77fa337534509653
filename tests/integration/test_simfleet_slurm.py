"""The simulated fleet's Slurm cluster (``simfleet up --slurm``): real slurmctld, slurmd and MUNGE.

A fleet of its own with two nodes (an H100 node of 8 GPUs, an L40S node of 4), brought up with
``make_fleet(..., slurm=True)``: slurmctld and munged on the host, slurmd and munged in each node.
The tests run in order: registration, a batch job, a drain while a job runs, resume, a reboot that
Slurm runs (``scontrol reboot ASAP nextstate=RESUME``), a reboot outside Slurm of a drained node,
and a ``down`` that leaves nothing behind.
Node states are read from ``scontrol show node -o`` (``simfleet.slurmconf.parse_show_node``).
"""

from __future__ import annotations

import os
import time

import pytest

from simfleet.testing import SimFleet, fleet_unavailable, make_fleet, session_fleet_name

pytestmark = pytest.mark.fleet

JOB_SECONDS = 12


@pytest.fixture(scope="module")
def cluster():
    """(SimFleet, Fleet) of a two-node fleet with Slurm, taken down at the end if a test did not."""
    reason = fleet_unavailable()
    if reason:
        pytest.skip(reason)
    from simfleet.fleet import Fleet  # pylint: disable=import-outside-toplevel

    name = session_fleet_name("pytest-slurm")
    try:
        fleet = make_fleet(name, 2, "h100,l40s", os.environ.get("SIMFLEET_TEST_PORTS"), slurm=True)
    except BaseException:
        # A fleet that came half up (nodes booted, Slurm not registered) is not left running.
        if os.environ.get("SIMFLEET_TEST_KEEP") != "1" and os.path.isdir(Fleet(name).dir):
            Fleet(name).down(purge=True)
        raise
    try:
        yield SimFleet(fleet), fleet
    finally:
        if os.path.isdir(fleet.dir):
            fleet.down(purge=True)


def _wait(predicate, timeout=60.0, what="condition", interval=0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out after %.0f s waiting for %s (last: %r)" % (timeout, what, last))


def _node(sf: SimFleet, name: str) -> dict:
    from simfleet import slurmconf  # pylint: disable=import-outside-toplevel

    fields = sf.slurm_nodes()[name]
    return dict(slurmconf.node_state(fields), state=fields["State"], reason=fields.get("Reason"), fields=fields)


def _wait_node(sf: SimFleet, name: str, check, timeout: float, what: str) -> dict:
    """Poll ``_node(sf, name)`` until ``check(node)`` holds; return that node's state."""
    seen = []

    def matches():
        seen[:] = [_node(sf, name)]
        return check(seen[0])

    _wait(matches, timeout, what)
    return seen[0]


def _new_boot(sf: SimFleet, name: str, before: str, timeout: float) -> str:
    """Wait for ``name`` to run a boot other than ``before``; return its boot id."""
    seen = []

    def rebooted():
        seen[:] = [sf.boot_id(name)]
        return seen[0] not in (None, before)

    _wait(rebooted, timeout, "%s's new boot" % name)
    return seen[0]


def _sbatch(sf: SimFleet, node: str, partition: str, script: str) -> str:
    proc = sf.slurm(["sbatch", "--parsable", "--nodelist=" + node, "--partition=" + partition, "--chdir=/root",
                     "--output=/root/job-%j.out", "--gres=gpu:1", "--wrap", script], check=True)
    job = proc.stdout.strip().split(";")[0]
    assert job.isdigit(), proc.stdout
    return job


def _job_state(sf: SimFleet, job: str) -> str:
    return sf.slurm(["squeue", "--noheader", "--jobs", job, "--format", "%T"]).stdout.strip()


def test_nodes_register_idle_with_their_gpus_and_partitions(cluster):
    sf, fleet = cluster
    shown = sf.slurm_nodes()
    assert sorted(shown) == ["node01", "node02"]
    assert shown["node01"]["State"] == "IDLE"
    assert shown["node02"]["State"] == "IDLE"
    assert shown["node01"]["Gres"] == "gpu:8"
    assert shown["node02"]["Gres"] == "gpu:4"
    assert sorted(shown["node01"]["Partitions"].split(",")) == ["gpu", "gpu_h100"]
    assert sorted(shown["node02"]["Partitions"].split(",")) == ["gpu", "gpu_l40s"]
    # Each slurmd listens on its own port of the fleet's range, at the address slurm.conf gives.
    assert shown["node01"]["Port"] == str(sf.slurmd_ports["node01"])
    assert shown["node02"]["NodeAddr"] == "127.0.0.1"
    # The default partition holds both nodes; the class partition one.
    assert sf.slurm(["sinfo", "--noheader", "--partition=gpu_h100", "--format=%N"], check=True).stdout.strip() == "node01"
    # The wrapper in the fleet directory reaches the cluster without SLURM_CONF in the environment.
    import subprocess  # pylint: disable=import-outside-toplevel

    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    wrapped = subprocess.run([os.path.join(fleet.slurm().bin_dir, "scontrol"), "show", "node", "-o", "node02"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    assert wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout.startswith("NodeName=node02 ")
    # The inventory says where Slurm commands run and each node's Slurm name.
    inv = sf.inventory_list()
    assert inv["_meta"]["hostvars"]["node01"]["simfleet_slurm_node_name"] == "node01"
    assert inv["_meta"]["hostvars"]["node02"]["simfleet_slurm_partition"] == "gpu_l40s"
    assert inv["_meta"]["hostvars"]["node01"]["simfleet_slurm_conf"] == sf.slurm_conf
    assert inv["_meta"]["hostvars"]["node02"]["simfleet_slurm_drain_host"] == "localhost"
    # `simfleet status` shows each node's Slurm state.
    from simfleet.cli import _status_text  # pylint: disable=import-outside-toplevel

    st = sf.status()
    assert [n["slurm"]["state"] for n in st["nodes"]] == ["IDLE", "IDLE"]
    assert st["slurm"]["slurmctld"]["state"] == "running"
    text = _status_text(st)
    assert [line.split()[8] for line in text.splitlines() if line.startswith("node0")] == ["IDLE", "IDLE"]


def test_a_batch_job_runs_on_the_node_it_asks_for(cluster):
    sf, _fleet = cluster
    job = _sbatch(sf, "node01", "gpu_h100", "echo host=$(hostname) job=$SLURM_JOB_ID gpus=$SLURM_JOB_GPUS")
    out = os.path.join(sf.root_of("node01"), "root", "job-%s.out" % job)
    _wait(lambda: os.path.exists(out) and _job_state(sf, job) == "", 60, "job %s to finish on node01" % job)
    with open(out, encoding="utf-8") as f:
        first = f.read().splitlines()[0]
    assert first.startswith("host=node01 job=%s " % job), first
    assert not os.path.exists(os.path.join(sf.root_of("node02"), "root", "job-%s.out" % job))


def test_a_drain_waits_for_the_running_job_then_resume_returns_the_node(cluster):
    sf, _fleet = cluster
    job = _sbatch(sf, "node01", "gpu", "sleep %d; echo done" % JOB_SECONDS)
    _wait(lambda: _job_state(sf, job) == "RUNNING", 30, "job %s running" % job)
    sf.slurm(["scontrol", "update", "NodeName=node01", "State=DRAIN", "Reason=gpufleet test: drain while busy"], check=True)
    busy = _node(sf, "node01")
    assert busy["summary"] == "draining", busy["state"]
    assert busy["base"] in ("ALLOCATED", "MIXED") and "DRAIN" in busy["flags"]
    assert busy["reason"].startswith("gpufleet test: drain while busy")
    # Still DRAINING while the job runs: it is not cut short.
    time.sleep(2)
    assert _node(sf, "node01")["summary"] == "draining"
    assert _job_state(sf, job) == "RUNNING"
    drained = _wait_node(sf, "node01", lambda n: n["summary"] == "drained", JOB_SECONDS + 40, "node01 DRAINED after the job")
    assert drained["state"] == "IDLE+DRAIN"
    assert _job_state(sf, job) == ""
    with open(os.path.join(sf.root_of("node01"), "root", "job-%s.out" % job), encoding="utf-8") as f:
        assert f.read().strip() == "done"
    sf.slurm(["scontrol", "update", "NodeName=node01", "State=RESUME"], check=True)
    # slurmctld pings a resumed node first (IDLE+NOT_RESPONDING for about a second), then it is IDLE.
    back = _wait_node(sf, "node01", lambda n: n["state"] == "IDLE", 30, "node01 IDLE after RESUME")
    assert not back["drain"] and back["responding"]
    assert back["reason"] is None


def test_scontrol_reboot_asap_reboots_the_node_and_returns_it_idle(cluster):
    sf, _fleet = cluster
    before = sf.boot_id("node02")
    assert before
    sf.slurm(["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=test", "node02"], check=True)
    _new_boot(sf, "node02", before, 120)
    back = _wait_node(sf, "node02", lambda n: n["state"] == "IDLE", 120, "node02 IDLE after its reboot")
    assert back["reason"] is None
    # Read once the node is back: while a node boots, the host may read another boot id through it;
    # slurmd can answer before sshd does.
    _wait(lambda: sf.run("node02", ["true"]).returncode == 0, 60, "node02's sshd after its reboot")
    after = sf.run("node02", ["cat", "/proc/sys/kernel/random/boot_id"], check=True).stdout.strip()
    assert after not in ("", before)
    assert sf.boot_id("node02") == after
    # The other node was left alone.
    assert _node(sf, "node01")["state"] == "IDLE"


def test_a_reboot_outside_slurm_keeps_a_drained_node_drained_with_its_reason(cluster):
    # What a rollout's own reboot (ansible.builtin.reboot, `simfleet reboot`) does to a node it drained.
    sf, _fleet = cluster
    sf.slurm(["scontrol", "update", "NodeName=node01", "State=DRAIN", "Reason=gpufleet r7: upgrade"], check=True)
    before = sf.boot_id("node01")
    assert sf.reboot("node01") not in (None, before)
    time.sleep(3)
    node = _wait_node(sf, "node01", lambda n: n["responding"], 30, "node01 responding")
    assert node["state"] == "IDLE+DRAIN"
    assert node["reason"].startswith("gpufleet r7: upgrade [root@")
    sf.slurm(["scontrol", "update", "NodeName=node01", "State=RESUME"], check=True)
    _wait(lambda: _node(sf, "node01")["state"] == "IDLE", 30, "node01 IDLE after RESUME")


def test_down_leaves_no_slurm_process_or_port(cluster):
    from simfleet.proc import cmdline, descendants, listening_ports, pid_alive  # pylint: disable=import-outside-toplevel

    sf, fleet = cluster
    st = fleet.status()
    host = fleet.slurm().pids()
    in_nodes = []
    for n in st["nodes"]:
        for pid in descendants(n["init_pid"]):
            try:
                with open("/proc/%d/comm" % pid, encoding="utf-8") as f:
                    if f.read().strip() in ("slurmd", "munged", "slurmstepd"):
                        in_nodes.append(pid)
            except OSError:
                continue
    assert len(host) >= 2 and len(in_nodes) >= 4, (host, in_nodes)
    ports = [sf.slurmctld_port] + sorted(sf.slurmd_ports.values())
    assert set(ports) <= listening_ports()

    fleet.down()

    assert [p for p in host + in_nodes if pid_alive(p)] == []
    assert set(ports) & listening_ports() == set()
    slurm_dir = fleet.slurm().dir
    left = [p for p in (int(x) for x in os.listdir("/proc") if x.isdigit()) if any(slurm_dir in a for a in cmdline(p))]
    assert left == []
    assert fleet.status()["slurm"]["slurmctld"]["state"] == "stopped"
    fleet.down(purge=True)
    assert not os.path.exists(fleet.dir)
