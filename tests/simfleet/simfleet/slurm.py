"""A real Slurm cluster in the simulated fleet (``simfleet up --slurm``): Debian 12's slurm-wlm 22.05 and MUNGE.

* host side, in ``<fleet>/slurm/``: ``slurmctld`` and a ``munged`` of its own (key, socket, pid and
  log files there), both started by the fleet (``spawn_detached``, pids recorded) and stopped by
  ``simfleet down``; ``slurmctld`` listens on a port of the fleet's range. Nothing system-wide:
  no unit, no ``/etc`` file, the host's own ``/etc/munge`` and ``/etc/slurm`` are not read.
  ``bin/`` holds wrappers (``scontrol``, ``sinfo``, ``squeue``, ``sbatch``, ``scancel``) that set
  ``SLURM_CONF`` to the fleet's ``slurm.conf``.
* nodes: ``slurmd`` and ``munged`` from Debian's packages, in a cached layer of their own
  (``<cache>/slurm-<key>``, an overlay upper directory over the node layer, made once with
  ``apt-get install`` in a container), used as the top lower directory by Slurm fleets only: the
  base and node layer of every other fleet stay as they are, and a Slurm fleet's ``up`` installs
  nothing. Each node gets the fleet's MUNGE key, the nodes' ``slurm.conf`` and a slurmd drop-in that
  writes its ``gres.conf`` from its simulated GPUs at each start of slurmd (``simgpu slurm-gres``:
  what ``AutoDetect=nvml`` finds, MIG devices included).
  ``slurmd`` runs with ``-b`` ("Report node rebooted when daemon restarted", slurmd(8)): a node is
  a container that shares the host's boot clock, so the uptime slurmd would report never restarts,
  and slurmctld would wait for the boot of a node it asked to reboot until ``ResumeTimeout``.

Packages on the control host: ``slurmctld``, ``slurm-client``, ``munge`` (``HOST_REQUIREMENTS``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Any, Callable, Sequence

from simfleet import slurmconf
from simfleet.proc import (
    SimfleetError,
    write_file,
    descendants,
    file_lock,
    pid_alive,
    port_listening,
    read_pid,
    run,
    send_signal,
    spawn_detached,
    unmount_under,
    wait_gone,
    write_atomic,
)

# Debian packages of the nodes' Slurm layer.
NODE_PACKAGES = ("slurmd", "munge")
# Bump when the way the Slurm layer is made changes.
LAYER_FORMAT = 2
# (command on the control host, Debian package that provides it)
HOST_REQUIREMENTS = (
    ("slurmctld", "slurmctld"),
    ("scontrol", "slurm-client"),
    ("sinfo", "slurm-client"),
    ("sbatch", "slurm-client"),
    ("munged", "munge"),
)
# The Slurm commands that get a wrapper in <fleet>/slurm/bin.
WRAPPED_COMMANDS = ("scontrol", "sinfo", "squeue", "sbatch", "scancel", "srun")
SLURMD_DEFAULTS = """\
# simfleet: report a new boot each time slurmd starts (it starts once per boot of the node): the
# node shares the host's boot clock, so its uptime would not tell slurmctld that it rebooted.
SLURMD_OPTIONS="-b"
"""
POLICY_RC_D = "#!/bin/sh\n# simfleet: start no service while the Slurm layer is built.\nexit 101\n"


def _log(msg: str) -> None:
    import sys  # pylint: disable=import-outside-toplevel

    print("simfleet: " + msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# the nodes' cached layer


def layer_key(lowerdirs: Sequence[str]) -> str:
    """Cache key of the Slurm layer: the directories it is made over, the packages, the format."""
    text = json.dumps({"lower": [os.path.basename(os.path.dirname(d)) for d in lowerdirs],
                       "packages": sorted(NODE_PACKAGES), "format": LAYER_FORMAT}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def ensure_layer(cache: str, lowerdirs: Sequence[str], log: Callable[[str], None] = _log) -> str:
    """Make (or reuse) ``<cache>/slurm-<key>/rootfs``, the nodes' Slurm layer over ``lowerdirs``; return it.

    Made once (about half a minute: ``apt-get update`` and ``apt-get install --no-install-recommends
    slurmd munge`` from the base's Debian mirror in a ``systemd-nspawn`` container over an overlay
    of ``lowerdirs``, no service started). The package lists and apt's cache are dropped from the
    layer (the nodes keep the base's), and so is the MUNGE key the package made: each fleet has
    its own. Serialised by ``<cache>/base.lock``. Raises SimfleetError when the install fails.
    """
    final = os.path.join(cache, "slurm-" + layer_key(lowerdirs))
    layer = os.path.join(final, "rootfs")
    if os.path.exists(os.path.join(final, "complete")):
        return layer
    with file_lock(os.path.join(cache, "base.lock"), "(building the Slurm layer)"):
        if os.path.exists(os.path.join(final, "complete")):
            return layer
        tmp = "%s.tmp-%d" % (final, os.getpid())
        upper, work, merged = (os.path.join(tmp, d) for d in ("rootfs", "work", "merged"))
        for d in (upper, work, merged):
            os.makedirs(d)
        log("building the nodes' Slurm layer (apt-get install %s)" % " ".join(NODE_PACKAGES))
        started = time.monotonic()
        opts = "lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,metacopy=off" % (":".join(lowerdirs), upper, work)
        run(["mount", "-t", "overlay", "overlay", "-o", opts, merged])
        try:
            write_file(os.path.join(merged, "usr/sbin/policy-rc.d"), POLICY_RC_D, 0o755)
            script = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                      "--no-install-recommends %s && apt-get clean" % " ".join(NODE_PACKAGES))
            argv = ["systemd-nspawn", "-q", "-D", merged, "--register=no", "--keep-unit",
                    "--machine=sf-slurm-build-%d" % os.getpid(), "/bin/sh", "-c", script]
            with open(os.path.join(tmp, "install.log"), "w", encoding="utf-8") as out:
                proc = run(argv, check=False, stdout=out, stderr=out, timeout=900, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                with open(os.path.join(tmp, "install.log"), encoding="utf-8", errors="replace") as f:
                    tail = "".join(f.readlines()[-15:])
                raise SimfleetError("installing %s in the Slurm layer failed (status %d); last lines:\n%s"
                                    % (" ".join(NODE_PACKAGES), proc.returncode, tail))
            os.unlink(os.path.join(merged, "usr/sbin/policy-rc.d"))
            for rel in ("etc/munge/munge.key",):
                if os.path.lexists(os.path.join(merged, rel)):
                    os.unlink(os.path.join(merged, rel))
            write_file(os.path.join(merged, "etc/default/slurmd"), SLURMD_DEFAULTS)
            os.makedirs(os.path.join(merged, "var/log/slurm"), exist_ok=True)
            os.makedirs(os.path.join(merged, "var/spool/slurmd"), exist_ok=True)
        finally:
            unmount_under(merged)
        # Straight from the upper directory: the lower layers' files show through again.
        for rel in ("var/lib/apt/lists", "var/cache/apt", "etc/resolv.conf", "var/log/apt", "var/log/dpkg.log"):
            path = os.path.join(upper, rel)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.unlink(path)
        shutil.rmtree(work)
        os.rmdir(merged)
        versions = run(["dpkg-query", "--admindir=" + os.path.join(upper, "var/lib/dpkg"), "-W", "-f", "${Package} ${Version}\n"]
                       + list(NODE_PACKAGES), check=False).stdout.split("\n")
        with open(os.path.join(tmp, "complete"), "w", encoding="utf-8") as f:
            json.dump({"lowerdirs": list(lowerdirs), "packages": [v for v in versions if v],
                       "seconds": round(time.monotonic() - started, 1)}, f)
        os.rename(tmp, final)
        log("Slurm layer built in %.0f s" % (time.monotonic() - started))
    return layer


def _node_user(root: str, user: str) -> tuple[int, int]:
    """uid and gid of ``user`` in the node's ``/etc/passwd`` (read from the host); KeyError when absent."""
    with open(os.path.join(root, "etc/passwd"), encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split(":")
            if len(parts) >= 4 and parts[0] == user:
                return int(parts[2]), int(parts[3])
    raise KeyError("no user %s in %s/etc/passwd" % (user, root))


# ---------------------------------------------------------------------------------------------
# a fleet's cluster


class SlurmCluster:
    """The Slurm cluster of the fleet in ``fleet_dir`` (files under ``<fleet_dir>/slurm``)."""

    def __init__(self, fleet_dir: str, fleet_name: str, log: Callable[[str], None] = _log):
        self.fleet_dir = fleet_dir
        self.fleet_name = fleet_name
        self.dir = os.path.join(fleet_dir, "slurm")
        self.log = log

    # ----- paths
    @property
    def conf_path(self) -> str:
        """The host side's ``slurm.conf`` (``SLURM_CONF`` for slurmctld and the commands)."""
        return os.path.join(self.dir, "slurm.conf")

    @property
    def node_conf_path(self) -> str:
        return os.path.join(self.dir, "node-slurm.conf")

    @property
    def bin_dir(self) -> str:
        return os.path.join(self.dir, "bin")

    @property
    def key_path(self) -> str:
        return os.path.join(self.dir, "munge", "key", "munge.key")

    @property
    def munge_socket(self) -> str:
        return os.path.join(self.dir, "munge", "run", "munge.socket")

    def _p(self, *names: str) -> str:
        return os.path.join(self.dir, *names)

    def env(self) -> dict[str, str]:
        """Environment for Slurm commands run on the host against this cluster."""
        return dict(os.environ, SLURM_CONF=self.conf_path)

    # ----- configuration
    def configure(self, rec: dict[str, Any], gpu_counts: dict[str, int]) -> bool:
        """Write the key (once), both ``slurm.conf`` copies and the wrappers; True when
        the configuration changed (slurmctld and the nodes' slurmd then have to restart).

        :param rec: the fleet record: ``slurm.slurmctld_port``, ``nodes[]`` with ``name``, ``class``
            and ``slurmd_port``.
        :param gpu_counts: node name -> ``Gres=gpu:<n>`` of the node in slurm.conf (the class profile's
            GPU count unless the fleet record's ``slurm_gpus`` of the node says otherwise).
        """
        for d in ("state", "munge/key", "munge/run", "bin"):
            os.makedirs(self._p(d), exist_ok=True)
        os.chmod(self._p("munge", "key"), 0o700)
        os.chmod(self._p("munge", "run"), 0o755)
        if not os.path.exists(self.key_path):
            # A MUNGE key is random bytes (mungekey(8) makes 1024 by default); one per fleet.
            fd = os.open(self.key_path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
            os.replace(self.key_path + ".tmp", self.key_path)
        nodes = [{"name": n["name"], "port": n["slurmd_port"], "gpus": gpu_counts[n["name"]], "klass": n["class"]}
                 for n in rec["nodes"]]
        common = dict(cluster=slurmconf.cluster_name(self.fleet_name), controller_host=socket.gethostname().split(".")[0],
                      controller_port=rec["slurm"]["slurmctld_port"], nodes=nodes, state_dir=self._p("state"),
                      log_dir=self.dir, cpus=1)
        host_text = slurmconf.render_slurm_conf(munge_socket=self.munge_socket, **common)
        changed = _read(self.conf_path) != host_text
        write_atomic(self.conf_path, host_text)
        write_atomic(self.node_conf_path, slurmconf.render_slurm_conf(**common))
        for name in WRAPPED_COMMANDS:
            real = shutil.which(name, path="/usr/bin:/usr/sbin:/bin:/sbin") or "/usr/bin/" + name
            write_atomic(os.path.join(self.bin_dir, name), slurmconf.wrapper_script(real, self.conf_path), 0o755)
        return changed

    def provision_node(self, root: str) -> bool:
        """Put the fleet's key, ``slurm.conf`` and the slurmd drop-in that writes ``gres.conf``
        (:func:`simfleet.slurmconf.render_slurmd_gres_dropin`) into a node's root; True when one changed."""
        changed = False
        for text, rel in ((_read(self.node_conf_path), "etc/slurm/slurm.conf"),
                          (slurmconf.render_slurmd_gres_dropin(), slurmconf.SLURMD_GRES_DROPIN)):
            if _read(os.path.join(root, rel)) != text:
                write_file(os.path.join(root, rel), text)
                changed = True
        key_dst = os.path.join(root, "etc/munge/munge.key")
        with open(self.key_path, "rb") as f:
            key = f.read()
        try:
            with open(key_dst, "rb") as f:
                same = f.read() == key
        except OSError:
            same = False
        if not same:
            uid, gid = _node_user(root, "munge")
            os.makedirs(os.path.dirname(key_dst), exist_ok=True)
            if os.path.lexists(key_dst):
                os.unlink(key_dst)
            fd = os.open(key_dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
            os.chown(key_dst, uid, gid)
            changed = True
        return changed

    # ----- host daemons
    def munged_pid(self) -> int | None:
        return read_pid(self._p("munge", "run", "munged.pid"), self.dir)

    def slurmctld_pid(self) -> int | None:
        return read_pid(self._p("slurmctld.pid"), self.dir)

    def start(self, port: int, timeout: float = 30.0) -> None:
        """Start the host's munged and slurmctld unless they run; wait until slurmctld answers on ``port``."""
        if not self.munged_pid():
            argv = ["munged", "-F", "--key-file=" + self.key_path, "--socket=" + self.munge_socket,
                    "--pid-file=" + self._p("munge", "run", "munged.pid"), "--log-file=" + self._p("munge", "munged.log"),
                    "--seed-file=" + self._p("munge", "munged.seed")]
            pid = spawn_detached(argv, self._p("munge", "munged.out"), env=_daemon_env(), cwd="/")
            write_atomic(self._p("munge", "run", "munged.pid"), "%d\n" % pid)
            deadline = time.monotonic() + 10
            while not os.path.exists(self.munge_socket):
                if time.monotonic() > deadline or not pid_alive(pid):
                    raise SimfleetError("munged did not start; see %s" % self._p("munge", "munged.out"))
                time.sleep(0.1)
        if not self.slurmctld_pid():
            pid = spawn_detached(["slurmctld", "-D", "-f", self.conf_path], self._p("slurmctld.out"),
                                 env=dict(_daemon_env(), SLURM_CONF=self.conf_path), cwd="/")
            write_atomic(self._p("slurmctld.pid"), "%d\n" % pid)
        deadline = time.monotonic() + timeout
        while not port_listening(port):
            pid = self.slurmctld_pid()
            if not pid or time.monotonic() > deadline:
                raise SimfleetError("slurmctld did not listen on 127.0.0.1:%d%s; see %s" % (
                    port, "" if pid else " (it exited)", self._p("slurmctld.log")))
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> list[int]:
        """Stop slurmctld (and what it forked) and munged by recorded pid: SIGTERM, then SIGKILL after
        ``timeout`` seconds. Returns the pids still alive afterwards (none, normally)."""
        left: list[int] = []
        for pid in (self.slurmctld_pid(), self.munged_pid()):
            if not pid:
                continue
            family = [pid] + descendants(pid)
            send_signal(pid, signal.SIGTERM)
            survivors = wait_gone(family, timeout)
            for p in survivors:
                send_signal(p, signal.SIGKILL)
            left += wait_gone(survivors, 5)
        return left

    def pids(self) -> list[int]:
        """The live host-side daemons of this cluster and their children."""
        out: list[int] = []
        for pid in (self.slurmctld_pid(), self.munged_pid()):
            if pid:
                out += [pid] + descendants(pid)
        return out

    # ----- commands
    def command(self, argv: Sequence[str], timeout: float = 30, check: bool = False) -> subprocess.CompletedProcess:
        """Run a Slurm command (``scontrol``, ``sinfo``, ``sbatch``, ...) on the host against this cluster."""
        proc = subprocess.run(list(argv), env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise SimfleetError("%s failed with status %d: %s" % (" ".join(argv), proc.returncode, proc.stderr.strip()))
        return proc

    def show_nodes(self) -> dict[str, dict[str, str]]:
        """``scontrol show node -o`` parsed (``slurmconf.parse_show_node``); ``{}`` when slurmctld does not answer."""
        if not self.slurmctld_pid():
            return {}
        try:
            proc = self.command(["scontrol", "show", "node", "-o"], timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if proc.returncode != 0:
            return {}
        return slurmconf.parse_show_node(proc.stdout)

    def describe(self, port: int | None) -> dict[str, Any]:
        """JSON-able state: slurmctld and munged pids, port, paths."""
        ctld = self.slurmctld_pid()
        return {
            "slurmctld": {"pid": ctld, "port": port, "state": "running" if ctld else "stopped"},
            "munged": {"pid": self.munged_pid(), "socket": self.munge_socket},
            "conf": self.conf_path,
            "bin": self.bin_dir,
            "log": self._p("slurmctld.log"),
        }


def _daemon_env() -> dict[str, str]:
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def gpu_count(klass: str) -> int:
    """Simulated GPUs of a node of GPU class ``klass`` (``simfleet.gpu.profiles.PROFILES``)."""
    from simfleet.gpu import profiles  # pylint: disable=import-outside-toplevel

    return int(profiles.PROFILES[klass]["count"])


__all__ = ["SlurmCluster", "ensure_layer", "layer_key", "gpu_count", "HOST_REQUIREMENTS", "NODE_PACKAGES"]
