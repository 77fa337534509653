"""Helpers for tests that drive the simulated fleet (used by tests/integration and molecule).

``make_fleet`` brings a fresh fleet up; ``SimFleet`` is the handle tests get (SSH, faults,
reboots, Ansible runs against the fleet's inventory); ``ansible_env`` is the environment for
ansible / ansible-playbook runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, Sequence

from simfleet import REPO_ROOT

DEFAULT_TEST_LAYOUT = "h100,a100,l40s,v100"


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


def make_fleet(name: str, count: int | None, layout: str, ports: str | None = None):
    """Bring a fresh fleet up (an old one of that name is purged first); return the Fleet object."""
    from simfleet.fleet import Fleet  # pylint: disable=import-outside-toplevel

    purge_stale_test_fleets()
    fleet = Fleet(name)
    if os.path.isdir(fleet.dir):
        fleet.down(purge=True)
    fleet.up(count=count, layout=layout, ports=ports)
    return fleet
