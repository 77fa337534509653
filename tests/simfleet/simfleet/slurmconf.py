"""The simulated fleet's Slurm configuration and the parsing of what ``scontrol`` prints (pure functions).

``render_slurm_conf`` writes the one ``slurm.conf`` that the host's ``slurmctld`` and every node's
``slurmd`` read; ``render_slurmd_gres_dropin`` the slurmd drop-in that writes a node's ``gres.conf``; ``parse_show_node`` reads
``scontrol show node -o`` (one line per node, ``Key=Value`` words).

Every option was checked against the slurm.conf(5), gres.conf(5) and scontrol(1) pages of Slurm
22.05 (Debian 12's slurm-wlm 22.05.8): ``NodeName ... Port`` ("the port number that the Slurm
compute node daemon, slurmd, listens to for work on this particular node ... development or
testing purposes"), ``SlurmdParameters=config_overrides`` (nodes are taken to have the configured
CPUs: every simulated node sees all of the host's), ``AuthInfo=socket=`` ("Used by auth/munge and
cred/munge": the host side talks to its own munged; the nodes' copy leaves it out, their munged
has the default socket, and ``DebugFlags=NO_CONF_HASH`` ("Do not log when the slurm.conf files
differ between Slurm daemons") keeps that one line from being logged as a mismatch), ``RebootProgram`` (run on the node by
``scontrol reboot``, the node is "marked DOWN if it doesn't reboot within ResumeTimeout"),
``ReturnToService=2`` ("A DOWN node will become available for use upon registration with a valid
configuration ... set DOWN for any reason"), ``ProctrackType=proctrack/linuxproc``,
``TaskPlugin=task/none`` and ``JobAcctGatherType=jobacct_gather/none`` (no cgroup plugin: a node
is a container).
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Mapping, Sequence

# The program slurmd runs for `scontrol reboot`: the reboot the fleet's own `simfleet reboot` does
# (the node's systemd ends nspawn with status 133 and the node's supervisor boots it again).
REBOOT_PROGRAM = "/usr/bin/systemctl reboot"
# Seconds a rebooting node has to register again before slurmctld marks it DOWN.
RESUME_TIMEOUT_S = 300
# The partition every node is in and jobs go to without --partition.
DEFAULT_PARTITION = "gpu"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def partition_of(klass: str) -> str:
    """Slurm partition of a GPU class: ``h100`` -> ``gpu_h100``."""
    return "gpu_" + klass


def cluster_name(fleet_name: str) -> str:
    """``ClusterName`` for a fleet: lower case (slurm.conf(5): upper case is "silently mapped to lower
    case"), letters, digits and ``_`` only, at most 40 characters (the limit slurm.conf(5) gives)."""
    name = re.sub(r"[^a-z0-9_]", "_", fleet_name.lower())
    return ("sf_" + name)[:40]


def _check_name(what: str, value: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ValueError("%s %r: use letters, digits, '.', '_' or '-'" % (what, value))
    return value


def _check_port(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError("%s %r is not a TCP port (1-65535)" % (what, value))
    return value


def render_slurm_conf(cluster: str, controller_host: str, controller_port: int, nodes: Sequence[Mapping[str, Any]],
                      state_dir: str, log_dir: str, munge_socket: str | None = None, cpus: int = 1) -> str:
    """The ``slurm.conf`` text of a simulated fleet.

    :param cluster: ``ClusterName`` (see :func:`cluster_name`).
    :param controller_host: the short host name of the machine that runs ``slurmctld`` (slurmctld
        refuses to start on a host whose ``hostname -s`` is not its ``SlurmctldHost``); its address
        is 127.0.0.1, where the nodes, sharing the host's network, reach it.
    :param controller_port: ``SlurmctldPort``.
    :param nodes: one mapping per node, in order: ``name`` (the node's host name, also its Slurm
        name), ``port`` (its slurmd's ``Port``), ``gpus`` (int >= 0, ``Gres=gpu:<n>``), ``klass``
        (GPU class: the node is in partition ``gpu_<klass>``).
    :param state_dir: ``StateSaveLocation`` (host side); ``log_dir``: where ``slurmctld.log`` and
        ``slurmctld.pid`` go (host side).
    :param munge_socket: the host side's munged socket (``AuthInfo=socket=``), for the copy that
        slurmctld and the host's commands read; None for the nodes' copy (their munged listens on
        MUNGE's default socket).
    :param cpus: ``CPUs`` of every node (with ``SlurmdParameters=config_overrides``).
    :returns: the file's text, ``Key=Value`` lines as slurm.conf(5) reads them.
    :raises ValueError: an empty node list, a duplicate node name or port, a bad name, port or GPU count.
    """
    if not nodes:
        raise ValueError("a Slurm cluster needs at least one node")
    _check_name("cluster name", cluster)
    _check_name("controller host", controller_host)
    _check_port("SlurmctldPort", controller_port)
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        raise ValueError("CPUs %r must be an integer >= 1" % (cpus,))
    seen_names: set[str] = set()
    seen_ports: set[int] = {controller_port}
    node_lines: list[str] = []
    partitions: dict[str, list[str]] = {}
    for node in nodes:
        name = _check_name("node name", node["name"])
        port = _check_port("Port of node %s" % name, node["port"])
        gpus = node["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise ValueError("GPU count %r of node %s must be an integer >= 0" % (gpus, name))
        if name in seen_names:
            raise ValueError("node %s is listed twice" % name)
        if port in seen_ports:
            raise ValueError("port %d of node %s is already taken by slurmctld or another node" % (port, name))
        seen_names.add(name)
        seen_ports.add(port)
        gres = " Gres=gpu:%d" % gpus if gpus else ""
        node_lines.append("NodeName=%s NodeAddr=127.0.0.1 Port=%d CPUs=%d%s State=UNKNOWN" % (name, port, cpus, gres))
        partitions.setdefault(partition_of(_check_name("GPU class", node["klass"])), []).append(name)
    lines = [
        "# slurm.conf of the simulated fleet's Slurm cluster, written by `simfleet up --slurm`; do not edit.",
        "ClusterName=%s" % cluster,
        "SlurmctldHost=%s(127.0.0.1)" % controller_host,
        "SlurmctldPort=%d" % controller_port,
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
    ]
    if munge_socket:
        lines.append("AuthInfo=socket=%s" % munge_socket)
    lines += [
        "DebugFlags=NO_CONF_HASH",
        "StateSaveLocation=%s" % state_dir,
        "SlurmctldLogFile=%s/slurmctld.log" % log_dir,
        "SlurmctldPidFile=%s/slurmctld.pid" % log_dir,
        "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "RebootProgram=\"%s\"" % REBOOT_PROGRAM,
        "ResumeTimeout=%d" % RESUME_TIMEOUT_S,
        "ReturnToService=2",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=60",
        "",
    ]
    lines += node_lines
    lines.append("")
    lines.append("PartitionName=%s Nodes=%s Default=YES MaxTime=INFINITE State=UP"
                 % (DEFAULT_PARTITION, ",".join(n["name"] for n in nodes)))
    for partition, members in partitions.items():
        lines.append("PartitionName=%s Nodes=%s MaxTime=INFINITE State=UP" % (partition, ",".join(members)))
    return "\n".join(lines) + "\n"


#: What slurmd runs before each start on a node of the fleet: the node's gres.conf written from its
#: simulated GPUs (simgpu.slurm_gres: what Slurm's AutoDetect=nvml would find, MIG devices included),
#: with the device nodes it names.
GRES_CONF = "/etc/slurm/gres.conf"
SLURMD_GRES_DROPIN = "etc/systemd/system/slurmd.service.d/simfleet-gres.conf"


def render_slurmd_gres_dropin() -> str:
    """The slurmd drop-in of a node: ``ExecStartPre`` writes ``/etc/slurm/gres.conf`` from the node's
    simulated GPUs (``simgpu slurm-gres --write``), so that each start of slurmd (a boot, a restart
    after a MIG layout change) sees the GPUs and MIG devices the node has then, as AutoDetect does."""
    return ("# simfleet: gres.conf from the simulated GPUs at each start of slurmd (what AutoDetect=nvml finds).\n"
            "[Service]\nExecStartPre=/usr/lib/simgpu/bin/simgpu slurm-gres --write %s\n" % GRES_CONF)


# Keys of `scontrol show node -o` whose value runs to the end of the line or to the next known key
# (free text with spaces). Reason is printed as "Reason=<text> [<user>@<time>]".
_FREE_TEXT_KEYS = ("Reason", "OS", "Comment", "Extra")


def parse_show_node(text: str) -> dict[str, dict[str, str]]:
    """Nodes of ``scontrol show node -o`` (or ``--oneliner``): node name -> its ``Key=Value`` fields.

    :param text: the command's output: one line per node, words ``Key=Value`` separated by spaces
        (scontrol(1), ``-o``: "Print information one line per record"). Values with spaces
        (``Reason``, ``OS``, ``Comment``, ``Extra``) are read up to the next `` Key=`` word.
    :returns: ``{"node01": {"NodeName": "node01", "State": "IDLE+DRAIN", "Gres": "gpu:8",
        "Partitions": "gpu,gpu_h100", "Reason": "test [root@2026-12-01T00:00:00]", ...}, ...}``,
        values as printed (strings); empty lines are skipped.
    :raises ValueError: a line that does not start with ``NodeName=``.
    """
    out: dict[str, dict[str, str]] = {}
    key_re = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*)=")
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not line.startswith("NodeName="):
            raise ValueError("not a line of `scontrol show node -o`: %r" % line[:120])
        starts = [(m.start(1), m.group(1), m.end()) for m in key_re.finditer(line)]
        fields: dict[str, str] = {}
        i = 0
        while i < len(starts):
            _pos, key, value_start = starts[i]
            j = i + 1
            if key in _FREE_TEXT_KEYS:
                # free text: up to the next word that is a key not seen yet on this line
                while j < len(starts) and (starts[j][1] in fields or starts[j][1] == key):
                    j += 1
            end = starts[j][0] if j < len(starts) else len(line)
            fields[key] = line[value_start:end].strip()
            i = j
        out[fields["NodeName"]] = fields
    return out


def node_state(fields: Mapping[str, str]) -> dict[str, Any]:
    """The state of one node of :func:`parse_show_node`: base state and flags.

    :param fields: one node's fields; ``State`` is ``BASE[+FLAG...]`` (scontrol(1), e.g.
        ``IDLE+DRAIN``, ``MIXED+DRAIN``, ``DOWN+REBOOT_ISSUED``; not responding is the flag
        ``NOT_RESPONDING`` in ``scontrol`` and a trailing ``*`` in ``sinfo``: both are read).
    :returns: ``{"base": "IDLE", "flags": ["DRAIN"], "responding": bool, "drain": bool, "summary": str}``
        where ``summary`` is what ``sinfo`` calls the state: ``draining`` (DRAIN with jobs: base
        ALLOCATED or MIXED), ``drained`` (DRAIN, no jobs), else the base state in lower case.
    :raises ValueError: no ``State`` field.
    """
    state = fields.get("State")
    if not state:
        raise ValueError("no State in %r" % dict(fields))
    parts = state.rstrip("*").split("+")
    base, flags = parts[0].upper(), [p.upper() for p in parts[1:] if p]
    responding = not state.endswith("*") and "NOT_RESPONDING" not in flags
    drain = "DRAIN" in flags
    if drain and base in ("ALLOCATED", "MIXED", "COMPLETING"):
        summary = "draining"
    elif drain:
        summary = "drained"
    else:
        summary = base.lower()
    return {"base": base, "flags": flags, "responding": responding, "drain": drain, "summary": summary}


def wrapper_script(real: str, slurm_conf: str) -> str:
    """A ``/bin/sh`` script that runs the Slurm command ``real`` against the fleet's ``slurm.conf``."""
    return "#!/bin/sh\n# %s against the simulated fleet's Slurm cluster.\nSLURM_CONF=%s exec %s \"$@\"\n" % (
        real, shlex.quote(slurm_conf), shlex.quote(real))
