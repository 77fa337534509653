"""The simulated fleet's own lifecycle: up twice, crash recovery, reboot_hang, a clean down.

These tests take nodes down and kill processes, so they run on a small fleet of their own (two
nodes, about two seconds to boot from the cached base) instead of the shared ``simfleet`` one.
That fleet is brought up while something else listens on the default range's first port (the
port a fleet of the default range gives its apt repository), as another fleet on the machine
would. The last test takes that fleet down and checks that nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from simfleet.testing import fleet_unavailable, make_fleet, session_fleet_name

pytestmark = pytest.mark.fleet


def _proc_descendants(pid):
    from simfleet.proc import descendants  # pylint: disable=import-outside-toplevel

    return descendants(pid)


@pytest.fixture(scope="module")
def own_fleet():
    reason = fleet_unavailable()
    if reason:
        pytest.skip(reason)
    from simfleet import DEFAULT_PORT_RANGE  # pylint: disable=import-outside-toplevel
    from simfleet.proc import parse_port_range  # pylint: disable=import-outside-toplevel

    busy = parse_port_range(os.environ.get("SIMFLEET_PORTS") or DEFAULT_PORT_RANGE)[0]
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        blocker.bind(("127.0.0.1", busy))
        blocker.listen(1)
    except OSError:
        pass  # something already listens there: the port is busy all the same
    try:
        fleet = make_fleet(session_fleet_name("pytest-lifecycle"), 2, "l40s,v100", os.environ.get("SIMFLEET_TEST_PORTS"))
    finally:
        blocker.close()
    fleet.busy_port = busy
    yield fleet
    if os.path.isdir(fleet.dir):
        fleet.down(purge=True)


def _wait(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out waiting for " + what)


def _snapshot(fleet):
    return {n["name"]: (n["supervisor_pid"], n["nspawn_pid"], n["init_pid"], n["boot_id"]) for n in fleet.status()["nodes"]}


def test_up_twice_keeps_running_nodes(own_fleet):
    before = _snapshot(own_fleet)
    assert all(all(v) for v in before.values())
    st = own_fleet.up()
    assert _snapshot(own_fleet) == before
    assert [n["state"] for n in st["nodes"]] == ["running", "running"]
    # Asking for fewer nodes than the fleet has removes none.
    own_fleet.up(count=1)
    assert _snapshot(own_fleet) == before


def test_a_busy_default_repository_port_moves_the_fleet_to_a_free_range(own_fleet):
    if os.environ.get("SIMFLEET_TEST_PORTS"):
        pytest.skip("SIMFLEET_TEST_PORTS gives the range")
    from simfleet.proc import parse_port_range  # pylint: disable=import-outside-toplevel

    st = own_fleet.status()
    lo, hi = parse_port_range(st["port_range"])
    ports = [st["repo"]["port"]] + [n["port"] for n in st["nodes"]]
    assert own_fleet.busy_port not in ports
    assert not lo <= own_fleet.busy_port <= hi
    # The fleet took the first ports of the range it chose: repository, then one per node.
    assert ports == [lo, lo + 1, lo + 2]
    assert st["repo"]["state"] == "running"


def test_crashed_nspawn_is_restarted_by_its_supervisor(own_fleet):
    node = own_fleet.node("node01")
    sup, nspawn, init, boot = node.supervisor_pid(), node.nspawn_pid(), node.leader_pid(), node.boot_id()
    os.kill(nspawn, signal.SIGKILL)
    _wait(lambda: node.state() == "running" and node.nspawn_pid() not in (None, nspawn), what="node01 back")
    assert node.supervisor_pid() == sup
    assert node.boot_id() != boot
    # The init the killed nspawn left behind was ended before the new boot.
    _wait(lambda: not os.path.exists("/proc/%d" % init) or _is_zombie(init), 10, "old init gone")


def _is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_node_without_supervisor_is_restarted_by_up(own_fleet):
    node = own_fleet.node("node02")
    sup = node.supervisor_pid()
    os.kill(sup, signal.SIGKILL)
    _wait(lambda: node.state() == "unsupervised", 10, "node02 unsupervised")
    own_fleet.up()
    assert node.state() == "running"
    assert node.supervisor_pid() not in (None, sup)


def test_reboot_hang_keeps_a_node_down_until_cleared(own_fleet):
    node = own_fleet.node("node02")
    own_fleet.fault("node02", "reboot_hang")
    assert own_fleet.reboot("node02") is None
    _wait(lambda: node.state() == "hung", 30, "node02 hung")
    time.sleep(2)
    assert node.nspawn_pid() is None and node.boot_id() is None
    own_fleet.fault("node02", "clear")
    _wait(lambda: node.state() == "running", 60, "node02 back after clear")


def test_reboot_command_returns_the_new_boot_id(own_fleet):
    node = own_fleet.node("node01")
    before = node.boot_id()
    after = own_fleet.reboot("node01")
    assert after and after != before
    assert own_fleet.ssh("node01", ["cat", "/proc/sys/kernel/random/boot_id"], check=True).stdout.strip() == after


def test_reset_gives_a_fresh_node(own_fleet):
    node = own_fleet.node("node02")
    own_fleet.ssh("node02", "echo dirty > /root/marker", check=True)
    own_fleet.fault("node02", "reboot_hang")
    own_fleet.fault("node02", "repo_unreachable")
    before = node.boot_id()
    own_fleet.reset(["node02"])
    assert node.state() == "running"
    assert node.boot_id() != before
    assert own_fleet.ssh("node02", ["test", "-e", "/root/marker"]).returncode == 1
    assert not os.path.exists(os.path.join(node.dir, "reboot_hang"))
    assert "node02" not in own_fleet.status()["repo"]["blocked"]
    # The untouched node kept running through the reset of its neighbour.
    assert own_fleet.node("node01").state() == "running"


def test_down_leaves_no_mounts_processes_or_ports(own_fleet):
    from simfleet import aptrepo  # pylint: disable=import-outside-toplevel
    from simfleet.proc import listening_ports, mounts, pid_alive  # pylint: disable=import-outside-toplevel

    st = own_fleet.status()
    pids = [st["repo"]["pid"]]
    ports = [st["repo"]["port"]] + [n["port"] for n in st["nodes"]]
    for n in st["nodes"]:
        pids += [n["supervisor_pid"], n["nspawn_pid"], n["init_pid"]] + _proc_descendants(n["init_pid"])
    assert all(pids) and len(pids) > 3 * len(st["nodes"])
    assert set(ports) <= listening_ports()
    assert any(m.startswith(own_fleet.dir + "/") for m, _fstype, _source in mounts())
    cgroups = [d for n in own_fleet.nodes() for d in n.cgroup_dirs()]
    assert cgroups and all(os.path.isdir(d) for d in cgroups)

    own_fleet.down()

    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        assert own_fleet.dir not in f.read()
    assert [p for p in pids if pid_alive(p)] == []
    assert set(ports) & listening_ports() == set()
    assert aptrepo.server_pid(own_fleet.dir) is None
    assert [d for d in cgroups if os.path.exists(d)] == []
    assert [n["state"] for n in own_fleet.status()["nodes"]] == ["stopped", "stopped"]

    own_fleet.down(purge=True)
    assert not os.path.exists(own_fleet.dir)
