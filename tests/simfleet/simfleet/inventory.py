"""The fleet's Ansible inventory: one group per GPU class, connection and repository variables.

Shape (YAML; ``render_ini`` writes the same in INI)::

    all:
      vars:        connection (root over SSH with the fleet key, host keys not checked, /usr/bin/python3)
                   and the repository key (simfleet_apt_key_path, _asc_path, _fingerprint)
      children:
        simfleet:
          children:
            gpu_h100: {hosts: {node01: {ansible_host: 127.0.0.1, ansible_port: 22201,
                                        simfleet_gpu_class: h100, gpufleet_gpu_count: 8,
                                        simfleet_apt_repo_url: ...}}}
            gpu_a100: ...

Group names are ``gpu_<class>`` for the classes of ``simfleet.gpu.profiles.PROFILES``.

A fleet with Slurm (``simfleet up --slurm``) adds, under ``all: vars:``, ``simfleet_slurm_conf``
(the host side's ``slurm.conf``: ``SLURM_CONF`` for ``scontrol`` / ``sinfo`` on the controller host),
``simfleet_slurm_bin_dir`` (wrappers that set it) and ``simfleet_slurm_drain_host: localhost`` (where
Slurm commands run: the controller host, which runs slurmctld), and per host
``simfleet_slurm_node_name`` (its ``NodeName``) and ``simfleet_slurm_partition`` (``gpu_<class>``).
"""

from __future__ import annotations

import json
from typing import Any

SSH_COMMON_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"


def group_of(klass: str) -> str:
    """Inventory group of a GPU class: ``h100`` → ``gpu_h100``."""
    return "gpu_" + klass


def fleet_vars(fleet: dict[str, Any]) -> dict[str, Any]:
    """The ``all`` variables of a fleet description (see ``Fleet.inventory_data``)."""
    return {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": fleet["ssh_key"],
        "ansible_ssh_common_args": SSH_COMMON_ARGS,
        "ansible_python_interpreter": "/usr/bin/python3",
        "simfleet_name": fleet["name"],
        "simfleet_apt_repo_port": fleet["repo_port"],
        "simfleet_apt_key_path": fleet["key"]["keyring_path"],
        "simfleet_apt_key_asc_path": fleet["key"]["armored_path"],
        "simfleet_apt_key_fingerprint": fleet["key"]["fingerprint"],
        **({"simfleet_slurm_conf": fleet["slurm"]["conf"], "simfleet_slurm_bin_dir": fleet["slurm"]["bin"],
            "simfleet_slurm_drain_host": "localhost"} if fleet.get("slurm") else {}),
    }


def host_vars(node: dict[str, Any]) -> dict[str, Any]:
    """Per-host variables of one node entry (name, class, port, root, repo_url).

    ``gpufleet_gpu_count`` declares the GPUs a node of its class has (the profile's count), so the
    drift report finds a node that lost one.
    """
    from simfleet.gpu import profiles  # pylint: disable=import-outside-toplevel

    return {
        "ansible_host": "127.0.0.1",
        "ansible_port": node["port"],
        "simfleet_gpu_class": node["class"],
        "gpufleet_gpu_count": int(profiles.PROFILES[node["class"]]["count"]),
        "simfleet_node_root": node["root"],
        "simfleet_apt_repo_url": node["repo_url"],
        **({"simfleet_slurm_node_name": node["name"], "simfleet_slurm_partition": "gpu_" + node["class"]}
           if node.get("slurmd_port") else {}),
    }


def groups(fleet: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Group name → node entries, groups in the order their class first appears."""
    out: dict[str, list[dict[str, Any]]] = {}
    for node in fleet["nodes"]:
        out.setdefault(group_of(node["class"]), []).append(node)
    return out


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # A JSON string is a valid YAML double-quoted scalar.
    return json.dumps(str(value))


def render_yaml(fleet: dict[str, Any]) -> str:
    """The inventory as YAML text."""
    lines = [
        "# Inventory of the simulated fleet %s, written by `simfleet up`; do not edit." % json.dumps(fleet["name"]),
        "all:",
        "  vars:",
    ]
    lines += ["    %s: %s" % (k, _scalar(v)) for k, v in fleet_vars(fleet).items()]
    lines += ["  children:", "    simfleet:", "      children:"]
    for group, nodes in groups(fleet).items():
        lines += ["        %s:" % group, "          hosts:"]
        for node in nodes:
            lines.append("            %s:" % node["name"])
            lines += ["              %s: %s" % (k, _scalar(v)) for k, v in host_vars(node).items()]
    return "\n".join(lines) + "\n"


def _ini_value(value: Any) -> str:
    text = _scalar(value) if not isinstance(value, str) else value
    if any(c in text for c in " '\"#;=") or not text:
        return "'%s'" % text.replace("'", "\\'")
    return text


def render_ini(fleet: dict[str, Any]) -> str:
    """The inventory as INI text."""
    lines = ["# Inventory of the simulated fleet %s, written by `simfleet up`; do not edit." % fleet["name"], ""]
    grouped = groups(fleet)
    for group, nodes in grouped.items():
        lines.append("[%s]" % group)
        for node in nodes:
            hv = " ".join("%s=%s" % (k, _ini_value(v)) for k, v in host_vars(node).items())
            lines.append("%s %s" % (node["name"], hv))
        lines.append("")
    lines.append("[simfleet:children]")
    lines += list(grouped)
    lines += ["", "[all:vars]"]
    lines += ["%s=%s" % (k, _ini_value(v)) for k, v in fleet_vars(fleet).items()]
    return "\n".join(lines) + "\n"


def render_json(fleet: dict[str, Any]) -> str:
    """The inventory in ``ansible-inventory --list`` JSON form."""
    grouped = groups(fleet)
    data: dict[str, Any] = {
        "_meta": {"hostvars": {n["name"]: host_vars(n) for n in fleet["nodes"]}},
        "all": {"children": ["simfleet", "ungrouped"], "vars": fleet_vars(fleet)},
        "simfleet": {"children": list(grouped)},
    }
    for group, nodes in grouped.items():
        data[group] = {"hosts": [n["name"] for n in nodes]}
    return json.dumps(data, indent=2) + "\n"
