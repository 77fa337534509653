"""A fleet: its nodes, keys, apt repository and inventory, and the lifecycle commands.

``fleet.json`` in the fleet directory records what the fleet is made of (nodes with class and port,
the repository port, the base layers the nodes are mounted on); everything else is derived from
the processes and mounts it recorded. Commands that change the fleet hold ``<fleet>/lock``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import sys
import time
from typing import Any, Callable, Iterable

from simfleet import DEFAULT_LAYOUT, DEFAULT_PORT_RANGE, cache_dir, fleet_dir, fleet_name
from simfleet import aptrepo, base, inventory, slurm, slurmconf
from simfleet.node import Node
from simfleet.proc import (
    SimfleetError,
    file_lock,
    mounts_under,
    parse_port_range,
    port_free,
    run,
    send_signal,
    wait_gone,
    write_atomic,
)

FORMAT = 1
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
DEFAULT_COUNT = 4
# Fault kinds handled here; every other kind goes to simfleet.gpu.faults.apply_fault.
FLEET_FAULTS = ("reboot_hang", "repo_unreachable")
# inotify instances each booted node needs (systemd, journald, dbus, sshd), with a margin.
INOTIFY_PER_NODE = 12


def _gpu():
    """The GPU simulation's modules (imported late: the lifecycle works without them for down/status)."""
    from simfleet.gpu import faults, profiles, state  # pylint: disable=import-outside-toplevel

    return profiles, state, faults


def parse_layout(text: str, count: int | None, classes: Iterable[str]) -> list[str]:
    """GPU class of each node from a layout string.

    ``"h100,a100"`` is cycled to ``count`` nodes (``count`` None: one node per item);
    ``"h100:2,l40s:1"`` gives explicit counts (``count``, if given, must match their sum).
    Raises SimfleetError on an unknown class or a count mismatch.
    """
    known = list(classes)
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise SimfleetError("empty layout; give GPU classes such as h100,a100 (known: %s)" % ", ".join(known))
    explicit = any(":" in x for x in items)
    out: list[str] = []
    for item in items:
        klass, _sep, n = item.partition(":")
        if klass not in known:
            raise SimfleetError("unknown GPU class %r in layout; known: %s" % (klass, ", ".join(known)))
        if explicit:
            try:
                reps = int(n) if n else 1
            except ValueError:
                raise SimfleetError("bad count in layout item %r" % item) from None
            out += [klass] * reps
        else:
            out.append(klass)
    if explicit:
        if count is not None and count != len(out):
            raise SimfleetError("layout %r has %d nodes, not %d" % (text, len(out), count))
        return out
    n = len(out) if count is None else count
    return [out[i % len(out)] for i in range(n)]


def _clear_kind(args: dict[str, Any] | list[str] | None) -> str | None:
    """The ``kind`` argument of a ``clear`` fault (dict key, ``kind=X`` word or bare word), or None."""
    if isinstance(args, dict):
        return args.get("kind")
    for word in args or []:
        key, sep, value = word.partition("=")
        if not sep:
            return word
        if key == "kind":
            return value
    return None


def _slurm_gpus(rec: dict[str, Any]) -> dict[str, int]:
    """Node name -> its ``Gres=gpu:<n>`` in slurm.conf: the node record's ``slurm_gpus`` (set by
    :meth:`Fleet.set_slurm_gpus`, as a site changes slurm.conf after a MIG layout change), else the
    GPU count of its class profile."""
    return {n["name"]: int(n["slurm_gpus"]) if n.get("slurm_gpus") is not None else slurm.gpu_count(n["class"])
            for n in rec["nodes"]}


def _log(msg: str) -> None:
    """Progress messages go to stderr, so stdout carries only the command's answer."""
    print("simfleet: " + msg, file=sys.stderr, flush=True)


class Fleet:
    """A named fleet in its directory. Construct, then call ``up``/``down``/``status``/…."""

    def __init__(self, name: str | None = None, state_dir: str | None = None, cache: str | None = None,
                 log: Callable[[str], None] = _log):
        self.name = name or fleet_name()
        if not NAME_RE.match(self.name):
            raise SimfleetError("fleet name %r: use letters, digits, '.', '_' or '-' (at most 40)" % self.name)
        self.cache = os.path.abspath(cache) if cache else cache_dir()
        if state_dir or not cache:
            self.dir = fleet_dir(self.name, state_dir)
        else:
            self.dir = os.path.join(self.cache, "fleets", self.name)
        self.log = log

    # ----- records
    @property
    def record_path(self) -> str:
        return os.path.join(self.dir, "fleet.json")

    @property
    def ssh_key(self) -> str:
        return os.path.join(self.dir, "ssh", "id_ed25519")

    @property
    def inventory_path(self) -> str:
        return os.path.join(self.dir, "inventory.yml")

    def exists(self) -> bool:
        return os.path.exists(self.record_path)

    def record(self) -> dict[str, Any]:
        """The parsed fleet.json; raises SimfleetError when there is no fleet."""
        try:
            with open(self.record_path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            raise SimfleetError("no fleet %r (nothing at %s); run `simfleet up` first" % (self.name, self.dir)) from None

    def _save(self, rec: dict[str, Any]) -> None:
        os.makedirs(self.dir, exist_ok=True)
        write_atomic(self.record_path, json.dumps(rec, indent=2, sort_keys=True) + "\n")

    def nodes(self, rec: dict[str, Any] | None = None) -> list[Node]:
        rec = rec if rec is not None else self.record()
        return [self._node(n) for n in rec["nodes"]]

    def _node(self, entry: dict[str, Any]) -> Node:
        machine = re.sub(r"[^a-z0-9-]", "-", ("sf-%s-%s" % (self.name, entry["name"])).lower())[:64]
        return Node(entry["name"], entry["class"], entry["port"], self.dir, machine)

    def node(self, name: str) -> Node:
        for n in self.nodes():
            if n.name == name:
                return n
        raise SimfleetError("no node %r in fleet %r (nodes: %s)" % (name, self.name, ", ".join(n.name for n in self.nodes())))

    def _lock(self):
        return file_lock(os.path.join(self.dir, "lock"), "(fleet %s)" % self.name)

    # ----- ports
    def _ports_of_other_fleets(self) -> set[int]:
        used: set[int] = set()
        for path in glob.glob(os.path.join(self.cache, "fleets", "*", "fleet.json")):
            if os.path.dirname(os.path.abspath(path)) == os.path.abspath(self.dir):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    rec = json.load(f)
                used.add(int(rec["repo_port"]))
                used.update(int(n["port"]) for n in rec["nodes"])
                used.update(int(n["slurmd_port"]) for n in rec["nodes"] if n.get("slurmd_port"))
                if (rec.get("slurm") or {}).get("slurmctld_port"):
                    used.add(int(rec["slurm"]["slurmctld_port"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return used

    def _allocate_ports(self, rec: dict[str, Any], count: int) -> list[int]:
        lo, hi = parse_port_range(rec["port_range"])
        taken = self._ports_of_other_fleets() | {rec.get("repo_port") or 0} | {n["port"] for n in rec["nodes"]}
        taken |= {n.get("slurmd_port") or 0 for n in rec["nodes"]} | {(rec.get("slurm") or {}).get("slurmctld_port") or 0}
        out: list[int] = []
        for port in range(lo, hi + 1):
            if len(out) == count:
                break
            if port in taken or not port_free(port):
                continue
            out.append(port)
        if len(out) < count:
            raise SimfleetError(
                "not enough free ports in %s for %d more; choose a wider range with --ports / SIMFLEET_PORTS"
                % (rec["port_range"], count)
            )
        return out

    # ----- up
    def up(self, count: int | None = None, layout: str | None = None, mirror: str | None = None,
           ports: str | None = None, timeout: float | None = None, slurm_cluster: bool = False) -> dict[str, Any]:
        """Bring the fleet up with ``count`` nodes (adding nodes to an existing fleet, never removing).

        Builds what is missing of the cached base, the driver packages, keys and repository; starts
        the repository server and every node that does not run; waits until every node answers SSH;
        writes the inventory. Running nodes are left alone, so a second ``up`` changes nothing.
        ``slurm_cluster`` (``up --slurm``; kept by the fleet once given) adds the Slurm cluster of
        ``simfleet.slurm``: slurmctld and munged on the host, slurmd and munged in every node, and
        waits until every node has registered with slurmctld. Returns ``status()``.
        """
        os.makedirs(self.dir, exist_ok=True)
        with_slurm = slurm_cluster or bool(self.exists() and self.record().get("slurm"))
        base.check_host(slurm.HOST_REQUIREMENTS if with_slurm else ())
        profiles, gstate, _faults = _gpu()
        with self._lock():
            started = time.monotonic()
            rec = self._load_or_new(ports)
            if with_slurm and not rec.get("slurm"):
                if any(n.mounted() for n in self.nodes(rec)):
                    raise SimfleetError("fleet %s runs without Slurm; `simfleet down`, then `up --slurm`" % self.name)
                rec["slurm"] = {"slurmctld_port": None}
            existing = len(rec["nodes"])
            if layout:
                rec["layout"] = layout
            if count is not None and count < existing:
                self.log("fleet %s has %d nodes; keeping them all (down --purge, then up, to shrink)" % (self.name, existing))
            if count is not None:
                want = max(existing, count)
            elif existing:
                want = existing
            else:
                want = len(parse_layout(rec["layout"], None, profiles.PROFILES)) if layout else DEFAULT_COUNT
            if want > existing:
                classes = parse_layout(rec["layout"], None, profiles.PROFILES)
                if ":" in rec["layout"] and want > len(classes):
                    raise SimfleetError("layout %r has %d nodes, asked for %d" % (rec["layout"], len(classes), want))
                if not rec.get("repo_port"):
                    rec["repo_port"] = self._allocate_ports(rec, 1)[0]
                new_ports = self._allocate_ports(rec, want - existing)
                for i, port in zip(range(existing, want), new_ports):
                    rec["nodes"].append({"name": "node%02d" % (i + 1), "class": classes[i % len(classes)], "port": port})
            if rec.get("slurm"):
                if not rec["slurm"].get("slurmctld_port"):
                    rec["slurm"]["slurmctld_port"] = self._allocate_ports(rec, 1)[0]
                lacking = [n for n in rec["nodes"] if not n.get("slurmd_port")]
                for n, port in zip(lacking, self._allocate_ports(rec, len(lacking)) if lacking else []):
                    n["slurmd_port"] = port
            self._raise_inotify_limit(len(rec["nodes"]))

            nodes = self.nodes(rec)
            recorded = rec.get("lowerdirs")
            if recorded and any(n.mounted() for n in nodes):
                # Running nodes keep the base and the driver packages they were made with (the
                # packages call into the node layer's files), also for nodes added now.
                lowerdirs = recorded
                if not all(os.path.isdir(d) for d in lowerdirs):
                    raise SimfleetError("the base this fleet runs on is gone; run `simfleet down` and `up` again")
                if "layer-" + base.layer_key() not in [os.path.basename(os.path.dirname(d)) for d in lowerdirs]:
                    self.log("the GPU simulation changed since fleet %s started; `down` and `up` to use it" % self.name)
                packages = rec.get("packages_dir") or ""
                if not os.path.isdir(packages):
                    packages = aptrepo.ensure_packages(self.cache, self.log)
            else:
                lowerdirs = base.ensure_base(self.cache, mirror, self.log)
                if rec.get("slurm"):
                    lowerdirs = [slurm.ensure_layer(self.cache, lowerdirs, self.log)] + lowerdirs
                if recorded and recorded != lowerdirs:
                    self.log("the base changed since fleet %s was made: its nodes start fresh" % self.name)
                    for n in nodes:
                        n.wipe()
                packages = aptrepo.ensure_packages(self.cache, self.log)
            rec["lowerdirs"] = lowerdirs
            self._save(rec)

            self._ensure_ssh_key()
            key = aptrepo.ensure_key(self.dir, self.name)
            if rec.get("packages_dir") != packages or not os.path.exists(os.path.join(self.dir, "repo", aptrepo.REPO_SUBDIR, "InRelease")):
                aptrepo.build_repo(self.dir, packages, key)
                rec["packages_dir"] = packages
            rec["key"] = {"fingerprint": key.fingerprint, "keyring_path": key.keyring_path, "armored_path": key.armored_path}
            self._save(rec)
            aptrepo.start_server(self.dir, rec["repo_port"])

            with open(self.ssh_key + ".pub", encoding="ascii") as f:
                pubkey = f.read()
            cluster = self.slurm() if rec.get("slurm") else None
            if cluster:
                if cluster.configure(rec, _slurm_gpus(rec)) and cluster.slurmctld_pid():
                    self.log("the Slurm configuration changed: restarting slurmctld")
                    cluster.stop()
                cluster.start(rec["slurm"]["slurmctld_port"])
            to_start, to_reconfigure = [], []
            for n in nodes:
                n.mount(lowerdirs)
                n.provision(pubkey, gstate.initial_state, gstate.save_state)
                slurm_changed = cluster.provision_node(n.root) if cluster else False
                if n.state() in ("running", "booting", "restarting", "hung"):
                    if slurm_changed:
                        to_reconfigure.append(n)
                    continue
                to_start.append(n)
            for n in to_start:
                n.start()
            if to_start:
                self.log("booting %d node(s): %s" % (len(to_start), ", ".join(n.name for n in to_start)))
            self._wait_ready(nodes, timeout if timeout is not None else 60 + 4 * len(nodes))
            for n in to_reconfigure:
                n.ssh(self.ssh_key, "systemctl daemon-reload && systemctl restart munge.service slurmd.service",
                      timeout=60, check=True)
            if cluster:
                self._wait_registered(cluster, [n for n in nodes if n.state() != "hung"], 60 + 2 * len(nodes))
            self.write_inventory(rec)
            self.log("fleet %s up: %d node(s) in %.1f s; inventory %s"
                     % (self.name, len(nodes), time.monotonic() - started, self.inventory_path))
        return self.status()

    def slurm(self) -> slurm.SlurmCluster:
        """The fleet's Slurm cluster (files under ``<fleet>/slurm``; running or not)."""
        return slurm.SlurmCluster(self.dir, self.name, self.log)

    def _wait_registered(self, cluster: slurm.SlurmCluster, nodes: list[Node], timeout: float) -> None:
        """Wait until slurmctld has heard from every node's slurmd (a state other than UNKNOWN, not ``*``).

        Raises SimfleetError at once for a node whose registration slurmctld refused (``INVALID_REG``,
        e.g. fewer GPUs reported than configured), with its reason, and after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        pending = [n.name for n in nodes]
        while pending:
            shown = cluster.show_nodes()
            invalid = ["%s (%s: %s)" % (name, shown[name]["State"], shown[name].get("Reason"))
                       for name in pending if name in shown and "INVALID_REG" in shown[name].get("State", "")]
            if invalid:
                raise SimfleetError("slurmctld refused the registration of %s; see %s" % (", ".join(invalid), cluster.describe(None)["log"]))
            pending = [name for name in pending
                       if name not in shown or shown[name].get("State", "").startswith("UNKNOWN") or shown[name].get("State", "").endswith("*")]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise SimfleetError("node(s) %s did not register with slurmctld within %.0f s; see %s and the nodes' "
                                    "/var/log/slurm/slurmd.log" % (", ".join(pending), timeout, cluster.describe(None)["log"]))
            time.sleep(0.5)

    def _load_or_new(self, ports: str | None) -> dict[str, Any]:
        if self.exists():
            rec = self.record()
            if rec.get("format") != FORMAT:
                raise SimfleetError("fleet %s was made by another simfleet version; `down --purge` it" % self.name)
            if ports and ports != rec["port_range"]:
                parse_port_range(ports)
                self.log("fleet %s keeps its ports from %s (asked %s)" % (self.name, rec["port_range"], ports))
            return rec
        port_range = ports or os.environ.get("SIMFLEET_PORTS") or DEFAULT_PORT_RANGE
        parse_port_range(port_range)
        return {
            "format": FORMAT,
            "name": self.name,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "port_range": port_range,
            "layout": os.environ.get("SIMFLEET_LAYOUT") or DEFAULT_LAYOUT,
            "repo_port": None,
            "nodes": [],
        }

    def _ensure_ssh_key(self) -> None:
        if os.path.exists(self.ssh_key) and os.path.exists(self.ssh_key + ".pub"):
            return
        os.makedirs(os.path.dirname(self.ssh_key), mode=0o700, exist_ok=True)
        for p in (self.ssh_key, self.ssh_key + ".pub"):
            if os.path.exists(p):
                os.unlink(p)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "simfleet-" + self.name, "-f", self.ssh_key])

    def _raise_inotify_limit(self, nodes: int) -> None:
        """Each booted node's systemd takes inotify instances from root's per-user limit."""
        path = "/proc/sys/fs/inotify/max_user_instances"
        try:
            with open(path, encoding="ascii") as f:
                current = int(f.read())
            need = 128 + INOTIFY_PER_NODE * (nodes + self._nodes_of_other_fleets())
            if current < need:
                with open(path, "w", encoding="ascii") as f:
                    f.write(str(need))
                self.log("raised fs.inotify.max_user_instances from %d to %d for %d nodes" % (current, need, nodes))
        except (OSError, ValueError) as exc:
            self.log("could not check fs.inotify.max_user_instances: %s" % exc)

    def _nodes_of_other_fleets(self) -> int:
        total = 0
        for path in glob.glob(os.path.join(self.cache, "fleets", "*", "fleet.json")):
            if os.path.dirname(os.path.abspath(path)) != os.path.abspath(self.dir):
                try:
                    with open(path, encoding="utf-8") as f:
                        total += len(json.load(f)["nodes"])
                except (OSError, ValueError, KeyError):
                    continue
        return total

    def _wait_ready(self, nodes: list[Node], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = [n for n in nodes if n.state() != "hung"]
        while pending:
            pending = [n for n in pending if not n.ssh_ready()]
            if not pending:
                return
            failed = [n for n in pending if not n.supervisor_pid() and not n.nspawn_pid()]
            if failed or time.monotonic() > deadline:
                bad = failed or pending
                details = "\n".join("--- %s (%s), last console lines:\n%s" % (n.name, n.state(), _tail(os.path.join(n.dir, "console.log")))
                                    for n in bad[:3])
                raise SimfleetError("node(s) %s did not come up%s\n%s" % (
                    ", ".join(n.name for n in bad), "" if failed else " within %.0f s" % timeout, details))
            time.sleep(0.2)

    # ----- down
    def down(self, purge: bool = False, timeout: float = 30.0) -> None:
        """Stop every node and the repository server, unmount everything below the fleet directory.

        Nodes get SIGTERM through their supervisor (a clean poweroff) and ``timeout`` seconds; then
        their init, nspawn and supervisor are killed by pid. ``purge`` removes the fleet directory.
        Raises SimfleetError when a mount or a recorded process is still there afterwards.
        """
        if not os.path.isdir(self.dir):
            self.log("no fleet %s at %s" % (self.name, self.dir))
            return
        with self._lock():
            nodes = self._all_nodes()
            self._stop_nodes(nodes, timeout)
            for n in nodes:
                n.remove_cgroups()
                n.remove_host_leftovers()
                n.unmount()
            cluster = self.slurm()
            cluster.stop()
            aptrepo.stop_server(self.dir)
            aptrepo.stop_gpg_agent(os.path.join(self.dir, "gpg"))
            self._verify_down(nodes, cluster)
            if purge:
                if mounts_under(self.dir):
                    raise SimfleetError("refusing to remove %s: still mounted below it" % self.dir)
            self.log("fleet %s down" % self.name)
        if purge:
            shutil.rmtree(self.dir)
            self.log("removed %s" % self.dir)

    def _all_nodes(self) -> list[Node]:
        """Nodes of fleet.json plus any node directory left without a record."""
        nodes = self.nodes() if self.exists() else []
        known = {n.name for n in nodes}
        for d in sorted(glob.glob(os.path.join(self.dir, "nodes", "*"))):
            name = os.path.basename(d)
            if name not in known and os.path.isdir(d):
                nodes.append(self._node({"name": name, "class": "unknown", "port": 0}))
        return nodes

    def _stop_nodes(self, nodes: list[Node], timeout: float) -> None:
        pids: list[int] = []
        for n in nodes:
            pids += n.request_stop()
        survivors = wait_gone(pids, timeout / 2)
        if survivors:
            # A node that was still starting units may have missed the first request: ask again.
            for n in nodes:
                nspawn = n.nspawn_pid()
                if nspawn:
                    send_signal(nspawn, signal.SIGTERM)
            survivors = wait_gone(survivors, timeout / 2)
        if survivors:
            slow = [n for n in nodes if n.running_pids()]
            self.log("node(s) %s did not power off within %.0f s; killing them" % (", ".join(n.name for n in slow), timeout))
            for n in slow:
                n.force_stop()
            survivors = wait_gone(survivors, 10)
            for pid in survivors:
                send_signal(pid, signal.SIGKILL)
            wait_gone(survivors, 5)

    def _verify_down(self, nodes: list[Node], cluster: slurm.SlurmCluster) -> None:
        left_mounts = mounts_under(self.dir)
        left_pids = [p for n in nodes for p in n.running_pids() + n.cgroup_pids()] + cluster.pids()
        left_mounts += [d for n in nodes for d in n.cgroup_dirs()]
        repo = aptrepo.server_pid(self.dir)
        if repo:
            left_pids.append(repo)
        if left_mounts or left_pids:
            raise SimfleetError("fleet %s not fully down: mounts/cgroups %s, processes %s" % (self.name, left_mounts, left_pids))

    # ----- status / inventory
    def status(self) -> dict[str, Any]:
        """JSON-able state of the fleet: paths, repository server, every node (see Node.describe)."""
        rec = self.record()
        nodes = [n.describe() for n in self.nodes(rec)]
        repo_pid = aptrepo.server_pid(self.dir)
        cluster_state = None
        if rec.get("slurm"):
            cluster = self.slurm()
            cluster_state = cluster.describe(rec["slurm"].get("slurmctld_port"))
            shown = cluster.show_nodes()
            for entry, n in zip(nodes, rec["nodes"]):
                entry["slurmd_port"] = n.get("slurmd_port")
                fields = shown.get(n["name"])
                entry["slurm"] = dict(slurmconf.node_state(fields), state=fields["State"], reason=fields.get("Reason")) if fields else None
        return {
            "name": self.name,
            "dir": self.dir,
            "inventory": self.inventory_path,
            "ssh_key": self.ssh_key,
            "port_range": rec["port_range"],
            "repo": {
                "port": rec.get("repo_port"),
                "pid": repo_pid,
                "state": "running" if repo_pid else "stopped",
                "blocked": sorted(aptrepo.blocked(self.dir)),
                "key": rec.get("key"),
            },
            "slurm": cluster_state,
            "nodes": nodes,
            "counts": {s: sum(1 for n in nodes if n["state"] == s) for s in sorted({n["state"] for n in nodes})},
        }

    def inventory_data(self, rec: dict[str, Any] | None = None) -> dict[str, Any]:
        """What the inventory renderers take: name, key paths, repo port, node entries."""
        rec = rec if rec is not None else self.record()
        if not rec.get("key"):
            raise SimfleetError("fleet %s has no repository key yet; run `simfleet up`" % self.name)
        return {
            "name": self.name,
            "ssh_key": self.ssh_key,
            "repo_port": rec["repo_port"],
            "key": rec["key"],
            "slurm": {"conf": self.slurm().conf_path, "bin": self.slurm().bin_dir} if rec.get("slurm") else None,
            "nodes": [
                dict(n, root=self._node(n).root, repo_url=aptrepo.repo_url(rec["repo_port"], n["name"]))
                for n in rec["nodes"]
            ],
        }

    def write_inventory(self, rec: dict[str, Any] | None = None) -> str:
        data = self.inventory_data(rec)
        write_atomic(self.inventory_path, inventory.render_yaml(data))
        write_atomic(os.path.join(self.dir, "inventory.ini"), inventory.render_ini(data))
        return self.inventory_path

    # ----- faults, reset, reboot
    def fault(self, node: str, kind: str, args: dict[str, Any] | list[str] | None = None) -> dict[str, Any]:
        """Inject fault ``kind`` on ``node`` (``all``: every node); return what was done.

        ``args``: a dict, or command-line words (``key=value`` or positional) as
        ``simfleet.gpu.faults.apply_fault`` takes them. ``reboot_hang`` and ``repo_unreachable``
        are handled here; ``clear`` (optionally ``kind=K``) clears those and is passed on; every
        other kind goes to ``simfleet.gpu.faults`` on the node's state file, through the node's
        root mount, under the state file's lock.
        """
        targets = self.nodes() if node == "all" else [self.node(node)]
        done: dict[str, Any] = {"fault": kind, "args": args or {}, "nodes": [n.name for n in targets]}
        if kind == "reboot_hang":
            for n in targets:
                n.hang_reboots(True)
            return done
        if kind == "repo_unreachable":
            for n in targets:
                aptrepo.set_blocked(self.dir, n.name, True)
            return done
        _profiles, gstate, faults = _gpu()
        if kind == "clear":
            which = _clear_kind(args)
            for n in targets:
                if which in (None, "reboot_hang"):
                    n.hang_reboots(False)
                if which in (None, "repo_unreachable"):
                    aptrepo.set_blocked(self.dir, n.name, False)
            if which in FLEET_FAULTS:
                return done
        for n in targets:
            if not os.path.exists(n.state_path):
                raise SimfleetError("node %s has no GPU state at %s; bring the fleet up first" % (n.name, n.state_path))
            try:
                if hasattr(faults, "apply_fault_to_file"):
                    faults.apply_fault_to_file(n.state_path, kind, args)
                else:
                    st = faults.apply_fault(gstate.load_state(n.state_path), kind, args)
                    gstate.save_state(n.state_path, st)
            except (ValueError, KeyError, TypeError) as exc:
                raise SimfleetError("fault %s %s on %s: %s" % (kind, args or "", n.name, exc)) from None
        return done

    def set_slurm_gpus(self, name: str, count: int | None) -> dict[str, Any]:
        """Change the node's ``Gres=gpu:<count>`` in the fleet's slurm.conf (``None``: back to its class's
        GPU count) the way Slurm asks for it (scontrol(1): "modify your slurm.conf and gres.conf files
        and restart daemons"): both slurm.conf copies are written, slurmctld and the node's slurmd are
        restarted and the node's registration is awaited (a refused one raises SimfleetError).

        :raises SimfleetError: no such node, a fleet without Slurm, or a count that is not an int >= 0.
        """
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise SimfleetError("GPU count %r of node %s must be an integer >= 0" % (count, name))
        with self._lock():
            rec = self.record()
            if not rec.get("slurm"):
                raise SimfleetError("fleet %s runs without Slurm" % self.name)
            entry = next((n for n in rec["nodes"] if n["name"] == name), None)
            if entry is None:
                raise SimfleetError("no node %s in fleet %s" % (name, self.name))
            entry["slurm_gpus"] = count
            self._save(rec)
        return self.up()

    def reset(self, names: Iterable[str] | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Put nodes (default: all) back to fresh: stop, drop their writable layer, boot anew."""
        _profiles, gstate, _faults = _gpu()
        with self._lock():
            rec = self.record()
            wanted = set(names or [])
            nodes = [n for n in self.nodes(rec) if not wanted or n.name in wanted]
            unknown = wanted - {n.name for n in nodes}
            if unknown:
                raise SimfleetError("no node(s) %s in fleet %s" % (", ".join(sorted(unknown)), self.name))
            self._stop_nodes(nodes, 30)
            with open(self.ssh_key + ".pub", encoding="ascii") as f:
                pubkey = f.read()
            for n in nodes:
                n.wipe()
                aptrepo.set_blocked(self.dir, n.name, False)
                n.mount(rec["lowerdirs"])
                n.provision(pubkey, gstate.initial_state, gstate.save_state)
                if rec.get("slurm"):
                    self.slurm().provision_node(n.root)
                n.start()
            self._wait_ready(nodes, timeout if timeout is not None else 60 + 4 * len(nodes))
        self.log("reset %s" % ", ".join(n.name for n in nodes))
        return self.status()

    def reboot(self, name: str, wait: bool = True, timeout: float = 120.0) -> str | None:
        """Reboot a node the way an operator would (``systemctl reboot`` over SSH) and wait for it.

        Returns the new boot id (None when not waiting, or when the reboot_hang fault holds the node
        down). Raises SimfleetError when the node does not come back within ``timeout`` seconds.
        """
        n = self.node(name)
        before = n.boot_id()
        if not before:
            raise SimfleetError("node %s is not running (state %s)" % (name, n.state()))
        proc = n.ssh(self.ssh_key, ["systemctl", "reboot"], timeout=30)
        if proc.returncode not in (0, 255):
            raise SimfleetError("systemctl reboot on %s failed: %s" % (name, proc.stderr.strip()))
        if not wait:
            return None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if n.state() == "hung":
                return None
            now = n.boot_id()
            if now and now != before and n.ssh_ready():
                return now
            time.sleep(0.2)
        raise SimfleetError("node %s did not come back from its reboot within %.0f s" % (name, timeout))

    def ssh(self, name: str, argv, **kwargs):
        """Run a command on a node over SSH (see Node.ssh)."""
        return self.node(name).ssh(self.ssh_key, argv, **kwargs)


def _tail(path: str, lines: int = 12) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no console log)"


def all_fleets(cache: str | None = None) -> list[str]:
    """Names of the fleets recorded in the cache's fleets directory."""
    root = os.path.join(cache or cache_dir(), "fleets")
    return sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(root, "*", "fleet.json")))


def in_use_layers(cache: str | None = None) -> set[str]:
    """Cached directories (base layers, driver packages) that some recorded fleet uses."""
    used: set[str] = set()
    root = os.path.join(cache or cache_dir(), "fleets")
    for path in glob.glob(os.path.join(root, "*", "fleet.json")):
        try:
            with open(path, encoding="utf-8") as f:
                rec = json.load(f)
            used.update(os.path.dirname(d) for d in rec.get("lowerdirs") or [])
            if rec.get("packages_dir"):
                used.add(rec["packages_dir"])
        except (OSError, ValueError):
            continue
    return used


__all__ = ["Fleet", "parse_layout", "all_fleets", "in_use_layers"]
