"""Helpers for tests that drive the simulated fleet (used by tests/integration and molecule).

``make_fleet`` brings a fresh fleet up; ``SimFleet`` is the handle tests get (SSH, faults,
reboots, Ansible runs against the fleet's inventory); ``ansible_env`` is the environment for
ansible / ansible-playbook runs.

Several test sessions (and fleets started by hand) may run on one machine at once. A test fleet
given no port range picks one of its own with ``choose_port_range``: a range that no other fleet
records, listens on or has claimed, claimed for this process (an ``flock`` on a file in
``port_claim_dir()``, released when the process ends), so two sessions never race for a port.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Sequence

from simfleet import DEFAULT_PORT_RANGE, REPO_ROOT, cache_dir

DEFAULT_TEST_LAYOUT = "h100,a100,l40s,v100"


def _fleet_driver_vars() -> str:
    """The driver role's variables of ``inventories/simfleet/group_vars/all.yml`` (the fleet's signed
    repository and key, no pynvml install, each GPU class's architecture and Fabric Manager) and the
    contract changes its operators accepted, with the catalog's date pinned for the tests, as
    lines to put under ``all: vars:``."""
    import yaml  # pylint: disable=import-outside-toplevel

    with open(os.path.join(REPO_ROOT, "inventories", "simfleet", "group_vars", "all.yml"), encoding="utf-8") as handle:
        declared = yaml.safe_load(handle)
    chosen = dict((key, value) for key, value in declared.items()
                  if key.startswith("driver_") or key in ("gpufleet_simfleet_architectures", "rollout_contract_accept"))
    chosen["driver_today"] = "2026-11-29"
    text = yaml.safe_dump(chosen, default_flow_style=False, sort_keys=True, width=1000)
    return "".join("    " + line + "\n" for line in text.splitlines())


# Lines under ``all: vars:`` of an inventory added to a test fleet's own.
FLEET_DRIVER_VARS = _fleet_driver_vars()


def baseline_playbook(version: str) -> str:
    """A playbook that installs and pins driver ``version`` with the driver role and boots into it."""
    return """\
- name: Install the baseline driver
  hosts: all
  gather_facts: false
  tasks:
    - name: Install and pin R%(branch)s
      ansible.builtin.include_role:
        name: gpufleet.nvidia.driver
      vars:
        driver_branch: "%(branch)s"
        driver_version: "%(version)s"
    - name: Boot the baseline driver
      ansible.builtin.reboot:
      when: driver_reboot_required | bool
""" % {"branch": version.split(".", 1)[0], "version": version}


def _tool(name: str) -> str:
    """An Ansible command next to this Python (the project's virtualenv), else from PATH."""
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.path.exists(candidate) else (shutil.which(name) or name)


def ansible_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for ansible / ansible-playbook runs against the fleet."""
    env = dict(os.environ)
    env.setdefault("ANSIBLE_CONFIG", os.path.join(REPO_ROOT, "tests", "ansible.cfg"))
    env["ANSIBLE_HOST_KEY_CHECKING"] = "False"
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    env.setdefault("ANSIBLE_DEPRECATION_WARNINGS", "False")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if extra:
        env.update(extra)
    return env


class SimFleet:
    """Handle on a running simulated fleet, given to tests by the ``simfleet`` fixture.

    Attributes: ``inventory`` (path of the YAML inventory), ``nodes`` (node names), ``classes``
    (node → GPU class), ``key_path`` (the fleet's SSH private key), ``apt_key_path`` /
    ``apt_key_fingerprint`` (the repository's signing key), ``dir`` (the fleet directory).
    """

    def __init__(self, fleet) -> None:
        self._fleet = fleet
        rec = fleet.record()
        self.name: str = fleet.name
        self.dir: str = fleet.dir
        self.inventory: str = fleet.inventory_path
        self.key_path: str = fleet.ssh_key
        self.nodes: list[str] = [n["name"] for n in rec["nodes"]]
        self.classes: dict[str, str] = {n["name"]: n["class"] for n in rec["nodes"]}
        self.ports: dict[str, int] = {n["name"]: n["port"] for n in rec["nodes"]}
        self.apt_key_path: str = rec["key"]["keyring_path"]
        self.apt_key_fingerprint: str = rec["key"]["fingerprint"]
        self.repo_port: int = rec["repo_port"]
        # Slurm (fleets made with slurm=True): the host side's slurm.conf, slurmctld's port, each node's slurmd port.
        self.slurm_conf: str | None = fleet.slurm().conf_path if rec.get("slurm") else None
        self.slurmctld_port: int | None = (rec.get("slurm") or {}).get("slurmctld_port")
        self.slurmd_ports: dict[str, int] = {n["name"]: n["slurmd_port"] for n in rec["nodes"] if n.get("slurmd_port")}

    # ----- nodes
    def nodes_of(self, klass: str) -> list[str]:
        """Nodes whose GPU class is ``klass`` (``h100``, ``a100``, …)."""
        return [n for n in self.nodes if self.classes[n] == klass]

    def root_of(self, node: str) -> str:
        """Host path of the node's root filesystem (its overlay mount)."""
        return self._fleet.node(node).root

    def state_path(self, node: str) -> str:
        """Host path of the node's GPU state file (``/var/lib/simgpu/state.json`` inside)."""
        return self._fleet.node(node).state_path

    def state(self, node: str) -> dict[str, Any]:
        """The node's GPU state (``simfleet.gpu.state.load_state`` of its state file)."""
        from simfleet.gpu import state  # pylint: disable=import-outside-toplevel

        return state.load_state(self.state_path(node))

    def repo_url(self, node: str) -> str:
        """URL of the fleet's apt repository as seen from ``node`` (flat repository, ``deb URL /``)."""
        from simfleet import aptrepo  # pylint: disable=import-outside-toplevel

        return aptrepo.repo_url(self.repo_port, node)

    def boot_id(self, node: str) -> str | None:
        """The node's current boot id, read from the host (None while it is down)."""
        return self._fleet.node(node).boot_id()

    def inventory_list(self) -> dict[str, Any]:
        """The inventory as Ansible reads it (``ansible-inventory --list``)."""
        out = subprocess.run([_tool("ansible-inventory"), "-i", self.inventory, "--list"], env=ansible_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True).stdout
        return json.loads(out)

    def status(self) -> dict[str, Any]:
        """``simfleet status --json`` as a dict."""
        return self._fleet.status()

    # ----- Slurm
    def slurm(self, argv: Sequence[str], check: bool = False, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm command (``["scontrol", "show", "node", "-o"]``, ``sbatch`` ...) on the host against
        the fleet's cluster (``SLURM_CONF`` set); CompletedProcess with text stdout/stderr. Raises
        SimfleetError with ``check`` when it fails, and when the fleet has no Slurm."""
        from simfleet.proc import SimfleetError  # pylint: disable=import-outside-toplevel

        if not self.slurm_conf:
            raise SimfleetError("fleet %s was brought up without Slurm" % self.name)
        return self._fleet.slurm().command(argv, timeout=timeout, check=check)

    def slurm_nodes(self) -> dict[str, dict[str, str]]:
        """``scontrol show node -o`` parsed: node -> fields (``simfleet.slurmconf.parse_show_node``)."""
        from simfleet import slurmconf  # pylint: disable=import-outside-toplevel

        return slurmconf.parse_show_node(self.slurm(["scontrol", "show", "node", "-o"], check=True).stdout)

    def set_slurm_gpus(self, node: str, count: int | None) -> None:
        """Configure ``Gres=gpu:<count>`` for ``node`` in slurm.conf and restart the daemons, as a site
        does after a MIG layout change (``simfleet.fleet.Fleet.set_slurm_gpus``)."""
        self._fleet.set_slurm_gpus(node, count)

    # ----- acting
    def run(self, node: str, argv: Sequence[str] | str, check: bool = False, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess:  # noqa: A002
        """Run ``argv`` on ``node`` as root over SSH; CompletedProcess with text stdout/stderr.

        A list is quoted for the remote shell; a string is given to the remote shell as is.
        """
        return self._fleet.ssh(node, argv, check=check, timeout=timeout, input=input)

    def fault(self, node: str, kind: str, **args: Any) -> dict[str, Any]:
        """Inject a fault (``simfleet fault NODE KIND KEY=VALUE…``); ``node`` may be ``all``."""
        return self._fleet.fault(node, kind, args)

    def reboot(self, node: str, timeout: float = 120) -> str | None:
        """Reboot ``node`` (``systemctl reboot``) and wait for its new boot; return the new boot id."""
        return self._fleet.reboot(node, wait=True, timeout=timeout)

    def reset(self, *nodes: str) -> None:
        """Put nodes (default: all) back to fresh: new writable layer, GPU state, boot."""
        self._fleet.reset(list(nodes) or None)

    def ansible(self, pattern: str, module: str, args: str | None = None, *extra: str,
                timeout: float = 600) -> subprocess.CompletedProcess:
        """Run an ad-hoc ``ansible`` module against the fleet's inventory."""
        argv = [_tool("ansible"), "-i", self.inventory, pattern, "-m", module]
        if args:
            argv += ["-a", args]
        return subprocess.run(argv + list(extra), env=ansible_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)

    def playbook(self, playbook: str, *extra: str, timeout: float = 1800,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``ansible-playbook`` with the fleet's inventory (stdout and stderr together)."""
        argv = [_tool("ansible-playbook"), "-i", self.inventory, playbook] + list(extra)
        return subprocess.run(argv, env=ansible_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, check=False)


def fleet_unavailable() -> str | None:
    """Why no fleet can run here (not root), or None."""
    if os.geteuid() != 0:
        return "the simulated fleet needs root (overlay mounts, systemd-nspawn)"
    return None


def session_fleet_name(prefix: str = "pytest") -> str:
    """A fleet name for this test process, ``<prefix>-<pid>``: test sessions running at the same
    time on one machine then never share (or take down) each other's fleet."""
    return "%s-%d" % (prefix, os.getpid())


def purge_stale_test_fleets() -> list[str]:
    """Take down and remove fleets named ``pytest…-<pid>`` whose test process is gone; return them."""
    import re  # pylint: disable=import-outside-toplevel

    from simfleet.fleet import Fleet, all_fleets  # pylint: disable=import-outside-toplevel
    from simfleet.proc import pid_alive  # pylint: disable=import-outside-toplevel

    removed = []
    for name in all_fleets():
        m = re.fullmatch(r"pytest(?:-[a-z]+)*-(\d+)", name)
        if m and not pid_alive(int(m.group(1))):
            Fleet(name).down(purge=True)
            removed.append(name)
    return removed


# ----- ports of test fleets

# fleet name -> open file descriptor of the claim file this process holds for the fleet's range
_PORT_CLAIMS: dict[str, int] = {}


def port_claim_dir() -> str:
    """Machine-wide directory of port range claims: ``$SIMFLEET_PORT_CLAIMS``, else
    ``/run/lock/simfleet-ports``, else ``simfleet-ports`` in the temporary directory.

    It must not depend on the repository or the cache: sessions of different checkouts share
    the machine's ports.
    """
    if os.environ.get("SIMFLEET_PORT_CLAIMS"):
        return os.environ["SIMFLEET_PORT_CLAIMS"]
    if os.path.isdir("/run/lock") and os.access("/run/lock", os.W_OK):
        return "/run/lock/simfleet-ports"
    return os.path.join(tempfile.gettempdir(), "simfleet-ports")


def recorded_ports(cache: str | None = None, exclude: str | None = None) -> set[int]:
    """Ports (repository and nodes) that the fleets recorded in the cache use, except fleet ``exclude``."""
    used: set[int] = set()
    for path in glob.glob(os.path.join(cache or cache_dir(), "fleets", "*", "fleet.json")):
        if exclude and os.path.basename(os.path.dirname(path)) == exclude:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                rec = json.load(f)
            if rec.get("repo_port"):
                used.add(int(rec["repo_port"]))
            used.update(int(n["port"]) for n in rec.get("nodes") or [])
            used.update(int(n["slurmd_port"]) for n in rec.get("nodes") or [] if n.get("slurmd_port"))
            if (rec.get("slurm") or {}).get("slurmctld_port"):
                used.add(int(rec["slurm"]["slurmctld_port"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return used


def _claim(lo: int, hi: int, holder: str, claim_dir: str) -> int | None:
    """Take the claim on ports ``lo``-``hi`` (non-blocking ``flock``); its fd, or None when held elsewhere."""
    os.makedirs(claim_dir, exist_ok=True)
    fd = os.open(os.path.join(claim_dir, "%d-%d.lock" % (lo, hi)), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, ("%d %s\n" % (os.getpid(), holder)).encode("utf-8"))
    return fd


def release_port_range(fleet: str) -> None:
    """Give up the port range claimed for ``fleet`` by this process (nothing when none is held)."""
    fd = _PORT_CLAIMS.pop(fleet, None)
    if fd is not None:
        os.close(fd)


def choose_port_range(needed: int, configured: str | None = None, fleet: str | None = None,
                      cache: str | None = None, claim_dir: str | None = None) -> str:
    """A port range (``"FIRST-LAST"``) for a new fleet that needs ``needed`` ports, claimed for ``fleet``.

    Candidates are ``configured`` (default ``$SIMFLEET_PORTS`` or ``DEFAULT_PORT_RANGE``) and
    then the ranges of the same size that follow it, up to port 65535. A candidate is taken
    when this process can claim it (an exclusive ``flock`` on ``<claim_dir>/FIRST-LAST.lock``,
    held until ``release_port_range(fleet)`` or the end of the process, so that sessions
    choosing at the same time never pick the same range), when no fleet recorded in the cache
    (``fleet.json``, other than ``fleet`` itself) has a port in it, when no socket listens on
    any of its ports (``/proc/net/tcp``, ``/proc/net/tcp6``) and when each of the ``needed``
    ports the fleet takes (the first ones of the range: the repository and one per node) can
    be bound on 127.0.0.1. Raises SimfleetError when no range is left.
    """
    from simfleet.proc import (  # pylint: disable=import-outside-toplevel
        SimfleetError,
        listening_ports,
        parse_port_range,
        port_free,
    )

    text = configured or os.environ.get("SIMFLEET_PORTS") or DEFAULT_PORT_RANGE
    first, last = parse_port_range(text)
    size = last - first + 1
    if needed > size:
        raise SimfleetError("port range %s has %d ports; the fleet needs %d" % (text, size, needed))
    claim_dir = claim_dir or port_claim_dir()
    holder = fleet or "pid-%d" % os.getpid()
    if fleet:
        release_port_range(fleet)
    recorded = recorded_ports(cache, exclude=fleet)
    for lo in range(first, 65536 - size + 1, size):
        hi = lo + size - 1
        fd = _claim(lo, hi, holder, claim_dir)
        if fd is None:
            continue
        ports = range(lo, hi + 1)
        busy = recorded | listening_ports()
        if any(p in busy for p in ports) or not all(port_free(p) for p in range(lo, lo + needed)):
            os.close(fd)
            continue
        # Without a fleet name the claim is held for the life of the process.
        _PORT_CLAIMS[fleet or "range-%d-%d" % (lo, hi)] = fd
        return "%d-%d" % (lo, hi)
    raise SimfleetError("no free range of %d ports from %d up (other fleets use them); "
                        "give one with SIMFLEET_TEST_PORTS" % (size, first))


def ports_needed(count: int | None, layout: str | None, slurm: bool = False) -> int:
    """Ports a new fleet of ``count`` nodes (None: one per ``layout`` item) takes: one per node and the
    repository's; with ``slurm``, also slurmctld's and one per node's slurmd."""
    from simfleet.fleet import DEFAULT_COUNT, parse_layout  # pylint: disable=import-outside-toplevel
    from simfleet.gpu.profiles import PROFILES  # pylint: disable=import-outside-toplevel

    if count is None:
        count = len(parse_layout(layout, None, PROFILES)) if layout else DEFAULT_COUNT
    return (count + 1) * (2 if slurm else 1)


def make_fleet(name: str, count: int | None, layout: str, ports: str | None = None, slurm: bool = False):
    """Bring a fresh fleet up (an old one of that name is purged first); return the Fleet object.

    ``ports`` (``"FIRST-LAST"``) is used as given; without it the fleet gets a range that no
    other fleet on this machine uses (``choose_port_range``), so a test never fails because
    another fleet is up. ``slurm``: with a Slurm cluster (``simfleet up --slurm``), up once
    every node has registered with slurmctld.
    """
    from simfleet.fleet import Fleet  # pylint: disable=import-outside-toplevel

    purge_stale_test_fleets()
    fleet = Fleet(name)
    if os.path.isdir(fleet.dir):
        fleet.down(purge=True)
    if not ports:
        ports = choose_port_range(ports_needed(count, layout, slurm), fleet=name, cache=fleet.cache)
    fleet.up(count=count, layout=layout, ports=ports, slurm_cluster=slurm)
    return fleet
