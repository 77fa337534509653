"""One node of the simulated fleet: its overlay root, identity, supervisor and nspawn process.

A node lives in ``<fleet>/nodes/<name>/``:

* ``upper/``, ``work/``: the overlay's writable layer; ``root/``: the mounted root filesystem;
* ``supervisor.pid``: the supervisor (``supervise.sh``) that runs ``systemd-nspawn`` in a loop;
  ``nspawn.pid`` (written by the supervisor) while nspawn runs; ``supervisor.state``;
* ``console.log`` (the node's console), ``supervisor.log``;
* ``reboot_hang``: present while the fault of that name is set.

Processes are only ever signalled by their recorded pid, after checking that the pid still runs a
command line naming this node's directory.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Sequence

from simfleet import PACKAGE_DIR
from simfleet.proc import (
    SimfleetError,
    write_file,
    children,
    is_mountpoint,
    pid_alive,
    port_free,
    read_pid,
    run,
    send_signal,
    spawn_detached,
    ssh_banner,
    unmount_under,
    write_atomic,
)

SUPERVISOR = os.path.join(PACKAGE_DIR, "supervise.sh")
STATE_PATH = "var/lib/simgpu/state.json"
SSH_OPTIONS = (
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "BatchMode=yes",
    "-o", "IdentitiesOnly=yes",
    "-o", "ConnectTimeout=10",
)
SSHD_CONFIG = """\
# simfleet: this node's SSH endpoint on the host's loopback (the nodes share the host's network).
Port {port}
ListenAddress 127.0.0.1
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 64:30:256
MaxSessions 64
"""
SUPERVISOR_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

# What a rollout leaves on a node, relative to its root: the drain mark (the drain command of
# inventories/simfleet/group_vars/all.yml touches it) and the rollout flag (a local facts file
# the node_upgrade role writes when it leaves a node drained and flagged).
DRAIN_MARK = "var/lib/gpufleet/drained"
ROLLOUT_FLAG = "etc/ansible/facts.d/gpufleet_rollout.fact"


def rollout_marks(root: str) -> dict:
    """The driver version, drain mark and rollout flag found in a node root (read from the host).

    :param root: the node's root filesystem as the host sees it.
    :returns: ``{"driver_version": str | None (the installed userspace driver: the library
        ``libnvidia-ml.so.1`` names, see simgpu.driver.userspace_version), "drained": bool,
        "flag": None | {"flagged": bool, "stage": str | None, "reason": str | None}}``; a flag file
        that is not a JSON object gives ``{"flagged": True, "stage": None, "reason": "unreadable
        flag file: ..."}``.
    :raises: nothing; a missing root gives no version, not drained, no flag.
    """
    import json  # pylint: disable=import-outside-toplevel

    from simfleet.gpu import simgpu  # pylint: disable=import-outside-toplevel

    driver = importlib.import_module(simgpu().__name__ + ".driver")
    flag = None
    flag_path = os.path.join(root, ROLLOUT_FLAG)
    if os.path.isfile(flag_path):
        try:
            with open(flag_path, encoding="utf-8") as handle:
                data = json.load(handle)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            flag = {"flagged": bool(data.get("flagged")), "stage": data.get("stage"), "reason": data.get("reason")}
        except (OSError, ValueError) as exc:
            flag = {"flagged": True, "stage": None, "reason": "unreadable flag file: %s" % exc}
    return {
        "driver_version": driver.userspace_version(root) if os.path.isdir(root) else None,
        "drained": os.path.lexists(os.path.join(root, DRAIN_MARK)),
        "flag": flag,
    }


@dataclass
class Node:
    """A node: ``name`` (hostname and inventory name), GPU ``klass`` (a key of PROFILES), SSH ``port``."""

    name: str
    klass: str
    port: int
    fleet_dir: str
    machine: str

    # ----- paths
    @property
    def dir(self) -> str:
        return os.path.join(self.fleet_dir, "nodes", self.name)

    @property
    def root(self) -> str:
        """The node's root filesystem as seen from the host (the overlay mount point)."""
        return os.path.join(self.dir, "root")

    @property
    def state_path(self) -> str:
        """Host path of the node's GPU state file (``/var/lib/simgpu/state.json`` inside)."""
        return os.path.join(self.root, STATE_PATH)

    def _p(self, name: str) -> str:
        return os.path.join(self.dir, name)

    @property
    def _tag(self) -> str:
        """A string every process of this node has in its argv (the node directory with a slash)."""
        return os.path.join(self.dir, "")

    # ----- filesystem
    def mounted(self) -> bool:
        return is_mountpoint(self.root)

    def provisioned(self) -> bool:
        return os.path.exists(self._p("provisioned"))

    def mount(self, lowerdirs: Sequence[str]) -> None:
        """Mount the overlay (lower = the cached base layers, upper/work = this node's)."""
        if self.mounted():
            return
        for d in ("upper", "work", "root"):
            os.makedirs(self._p(d), exist_ok=True)
        opts = "lowerdir=%s,upperdir=%s,workdir=%s" % (":".join(lowerdirs), self._p("upper"), self._p("work"))
        run(["mount", "-t", "overlay", "overlay", "-o", opts, self.root])

    def provision(self, public_key: str, initial_state: Callable[[str, str], dict], save_state: Callable[[str, dict], None]) -> None:
        """Give a freshly mounted node its identity: hostname, machine id, SSH, GPU state file.

        ``initial_state(profile, node_name)`` and ``save_state(path, state)`` come from
        ``simfleet.gpu.state``.
        """
        if self.provisioned():
            return
        r = self.root
        write_file(os.path.join(r, "etc/hostname"), self.name + "\n")
        write_file(
            os.path.join(r, "etc/hosts"),
            "127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n" % self.name,
        )
        write_file(os.path.join(r, "etc/machine-id"), uuid.uuid4().hex + "\n", 0o444)
        write_file(os.path.join(r, "etc/ssh/sshd_config.d/simfleet.conf"), SSHD_CONFIG.format(port=self.port))
        hostkey = os.path.join(r, "etc/ssh/ssh_host_ed25519_key")
        for path in (hostkey, hostkey + ".pub"):
            if os.path.lexists(path):
                os.unlink(path)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@" + self.name, "-f", hostkey])
        ssh_dir = os.path.join(r, "root/.ssh")
        os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
        os.chmod(ssh_dir, 0o700)
        write_file(os.path.join(ssh_dir, "authorized_keys"), public_key.strip() + "\n", 0o600)
        os.makedirs(os.path.dirname(self.state_path), exist_ok=True)
        save_state(self.state_path, initial_state(self.klass, self.name))
        write_atomic(self._p("provisioned"), "%s %s\n" % (self.klass, time.strftime("%Y-%m-%dT%H:%M:%S")))

    def unmount(self) -> None:
        """Unmount the overlay and anything mounted below the node directory."""
        unmount_under(self.dir)

    def wipe(self) -> None:
        """Back to fresh: drop the writable layer, identity and logs (node must be stopped)."""
        if self.running_pids():
            raise SimfleetError("node %s still runs; stop it before wiping it" % self.name)
        self.unmount()
        for d in ("upper", "work"):
            shutil.rmtree(self._p(d), ignore_errors=True)
        for f in ("provisioned", "console.log", "supervisor.log", "supervisor.state", "reboot_hang", "init.pid", "nspawn.pid"):
            try:
                os.unlink(self._p(f))
            except FileNotFoundError:
                pass

    # ----- processes
    def supervisor_pid(self) -> int | None:
        return read_pid(self._p("supervisor.pid"), self._tag)

    def nspawn_pid(self) -> int | None:
        return read_pid(self._p("nspawn.pid"), self._tag)

    def leader_pid(self) -> int | None:
        """Host pid of the node's init (PID 1 inside): the child of nspawn in a new pid namespace.

        Recorded by the supervisor in ``init.pid`` (an init outlives an nspawn killed with SIGKILL);
        its argv carries ``simfleet.node=<node dir>`` so the record can be checked.
        """
        recorded = read_pid(self._p("init.pid"), self._tag)
        if recorded:
            return recorded
        nspawn = self.nspawn_pid()
        if not nspawn:
            return None
        try:
            own = os.readlink("/proc/%d/ns/pid" % nspawn)
        except OSError:
            return None
        for child in children(nspawn):
            try:
                if os.readlink("/proc/%d/ns/pid" % child) != own:
                    return child
            except OSError:
                continue
        return None

    @property
    def cgroup_name(self) -> str:
        """The node's cgroup, relative to the cgroup its supervisor starts in."""
        return "simfleet/" + self.machine

    def cgroup_dirs(self) -> list[str]:
        """The node's cgroup directories (one per hierarchy) while its supervisor has them."""
        try:
            with open(self._p("cgroups"), encoding="utf-8") as f:
                return [d for d in f.read().split() if os.path.isdir(d)]
        except OSError:
            return []

    def cgroup_pids(self) -> list[int]:
        """Every process in the node's cgroup tree (the supervisor, nspawn, the node's processes)."""
        pids: set[int] = set()
        for top in self.cgroup_dirs():
            for dirpath, _dirs, files in os.walk(top):
                if "cgroup.procs" in files:
                    try:
                        with open(os.path.join(dirpath, "cgroup.procs"), encoding="ascii") as f:
                            pids.update(int(x) for x in f.read().split())
                    except (OSError, ValueError):
                        continue
        return sorted(pids)

    def remove_cgroups(self) -> None:
        """Remove the node's (empty) cgroup directories, deepest first."""
        for top in self.cgroup_dirs():
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda x: -x[0].count("/")):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
            try:
                os.rmdir(os.path.dirname(top))  # the shared "simfleet" level, once no node uses it
            except OSError:
                pass
        if not self.cgroup_dirs():
            try:
                os.unlink(self._p("cgroups"))
            except FileNotFoundError:
                pass

    def remove_host_leftovers(self) -> None:
        """Remove what an nspawn that was killed leaves on the host: its empty mount-propagation
        directory ``/run/systemd/nspawn/propagate/<machine>`` (named after this node only)."""
        if self.running_pids():
            return
        try:
            os.rmdir(os.path.join("/run/systemd/nspawn/propagate", self.machine))
        except OSError:
            pass

    def running_pids(self) -> list[int]:
        """The recorded, live pids of this node (supervisor, nspawn, init)."""
        return [p for p in (self.supervisor_pid(), self.nspawn_pid(), self.leader_pid()) if p]

    def nspawn_argv(self) -> list[str]:
        return [
            "systemd-nspawn",
            "-q",
            "-D", self.root,
            "--boot",
            "--register=no",
            "--keep-unit",
            "--machine=" + self.machine,
            "--console=read-only",
            "--link-journal=no",
            # arguments of the node's init: no colours in console.log; a tag naming this node
            "systemd.log_color=0",
            "simfleet.node=" + self._tag,
        ]

    def start(self) -> int:
        """Start the supervisor (and so the node) unless it already runs; return its pid.

        An nspawn left running without its supervisor (the supervisor was killed) is stopped
        first: the same tree cannot be booted twice.
        """
        pid = self.supervisor_pid()
        if pid:
            return pid
        if not self.mounted():
            raise SimfleetError("node %s is not mounted" % self.name)
        orphan = self.nspawn_pid()
        if orphan:
            send_signal(orphan, signal.SIGTERM)
            if not _wait_pids([orphan], 30):
                self.force_stop()
        init = self.leader_pid()
        if init:
            send_signal(init, signal.SIGKILL)
            _wait_pids([init], 10)
        # Leftovers in the node's cgroup (its supervisor was killed) would share the new tree.
        left = self.cgroup_pids()
        for p in left:
            send_signal(p, signal.SIGKILL)
        _wait_pids(left, 5)
        self.remove_cgroups()
        if not port_free(self.port):
            raise SimfleetError(
                "port %d for node %s is in use by another process; free it or bring the fleet up "
                "with another port range (--ports / SIMFLEET_PORTS)" % (self.port, self.name)
            )
        for f in ("nspawn.pid", "init.pid", "supervisor.state"):
            try:
                os.unlink(self._p(f))
            except FileNotFoundError:
                pass
        argv = ["/bin/sh", SUPERVISOR, self._tag] + self.nspawn_argv()
        env = dict(SUPERVISOR_ENV, SIMFLEET_CGROUP=self.cgroup_name)
        pid = spawn_detached(argv, self._p("supervisor.log"), env=env, cwd="/")
        write_atomic(self._p("supervisor.pid"), "%d\n" % pid)
        return pid

    def request_stop(self) -> list[int]:
        """Ask the node to stop (SIGTERM to the supervisor, which powers nspawn off); return pids to await."""
        pids = self.running_pids()
        sup, nspawn = self.supervisor_pid(), self.nspawn_pid()
        if sup:
            send_signal(sup, signal.SIGTERM)
        elif nspawn:
            send_signal(nspawn, signal.SIGTERM)
        return pids

    def force_stop(self) -> None:
        """SIGKILL the node's init (ending every process of its pid namespace), nspawn and supervisor."""
        sup = self.supervisor_pid()
        if sup:
            # Stop it from starting the node again before nspawn is killed.
            send_signal(sup, signal.SIGTERM)
        for pid in (self.leader_pid(), self.nspawn_pid()):
            if pid:
                send_signal(pid, signal.SIGKILL)
        _wait_pids([p for p in (sup,) if p], 3)
        sup = self.supervisor_pid()
        if sup:
            send_signal(sup, signal.SIGKILL)
        # Whatever is left in the node's own cgroup belongs to this node.
        left = self.cgroup_pids()
        for pid in left:
            send_signal(pid, signal.SIGKILL)
        _wait_pids(left, 5)
        self.remove_cgroups()

    def hang_reboots(self, on: bool) -> None:
        """Set or clear the reboot_hang fault (the supervisor reads the flag file)."""
        path = self._p("reboot_hang")
        if on:
            write_atomic(path, "set %s\n" % time.strftime("%Y-%m-%dT%H:%M:%S"))
        elif os.path.exists(path):
            os.unlink(path)

    # ----- observation
    def supervisor_state(self) -> str | None:
        try:
            with open(self._p("supervisor.state"), encoding="ascii") as f:
                return f.read().strip() or None
        except OSError:
            return None

    def boot_id(self) -> str | None:
        """The node's current boot id, read through its init's root (``/proc/sys/kernel/random/boot_id``)."""
        leader = self.leader_pid()
        if not leader:
            return None
        try:
            with open("/proc/%d/root/proc/sys/kernel/random/boot_id" % leader, encoding="ascii") as f:
                return f.read().strip()
        except OSError:
            return None

    def ssh_ready(self) -> bool:
        """True when the node's sshd answers with an SSH banner and nspawn runs."""
        return bool(self.nspawn_pid()) and ssh_banner(self.port) is not None

    def state(self) -> str:
        """running | booting | restarting | hung | unsupervised | stopped | failed | absent.

        ``unsupervised``: the node runs but its supervisor is gone (``up`` restarts such a node).
        """
        if not self.provisioned():
            return "absent"
        sup = self.supervisor_pid()
        sstate = self.supervisor_state()
        if sup:
            if sstate == "hung":
                return "hung"
            if self.nspawn_pid():
                return "running" if ssh_banner(self.port) else "booting"
            return "restarting"
        if self.nspawn_pid() or self.leader_pid():
            return "unsupervised"
        return "failed" if sstate == "failed" else "stopped"

    def describe(self) -> dict:
        """JSON-able status of the node."""
        return {
            "name": self.name,
            "class": self.klass,
            "port": self.port,
            "state": self.state(),
            "mounted": self.mounted(),
            "root": self.root,
            "supervisor_pid": self.supervisor_pid(),
            "nspawn_pid": self.nspawn_pid(),
            "init_pid": self.leader_pid(),
            "boot_id": self.boot_id(),
            "reboot_hang": os.path.exists(self._p("reboot_hang")),
            **rollout_marks(self.root),
        }

    # ----- ssh
    def ssh_argv(self, key_path: str, argv: Sequence[str] | str = ()) -> list[str]:
        """``ssh`` command line reaching this node as root with the fleet key; ``argv`` is run there.

        A list is quoted for the remote shell; a string is passed as is.
        """
        cmd = ["ssh", "-i", key_path, "-p", str(self.port)] + list(SSH_OPTIONS) + ["root@127.0.0.1"]
        if isinstance(argv, str):
            return cmd + [argv]
        if argv:
            import shlex  # pylint: disable=import-outside-toplevel

            cmd.append(" ".join(shlex.quote(a) for a in argv))
        return cmd

    def ssh(self, key_path: str, argv: Sequence[str] | str, timeout: float = 120, check: bool = False, input: str | None = None) -> subprocess.CompletedProcess:  # noqa: A002
        """Run ``argv`` on the node over SSH; CompletedProcess with text stdout/stderr."""
        proc = subprocess.run(
            self.ssh_argv(key_path, argv),
            input=input,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise SimfleetError("on %s, %s failed with status %d: %s" % (self.name, argv, proc.returncode, proc.stderr.strip()))
        return proc


def _wait_pids(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return not any(pid_alive(p) for p in pids)
