"""``simfleet``: command-line interface of the simulated fleet.

    simfleet [--name NAME] [--state-dir DIR] [--cache DIR] COMMAND ...

    up [N] [--layout L] [--ports A-B] [--mirror URL] [--slurm]
                                                        bring N nodes up (adds to a running fleet);
                                                        --slurm: with a Slurm cluster (slurmctld on the host)
    down [--purge]                                      stop nodes and the repository, unmount
    status [--json]                                     nodes, driver, drain mark, flag, Slurm state, boot ids, repository
    inventory [--format yaml|ini|json] [--path]         the Ansible inventory
    fault NODE|all KIND [KEY=VALUE ...]                 inject a fault (``clear`` removes them)
    reset [NODE ...]                                    nodes back to fresh
    reboot NODE [--no-wait]                             reboot a node, wait for the new boot
    ssh NODE [COMMAND ...]                              SSH into a node as root (COMMAND as ssh takes it)
    base [--mirror URL]                                 build the cached base only
    gc                                                  remove cached bases no fleet uses
    list                                                fleets in the cache

Environment: SIMFLEET_NAME, SIMFLEET_STATE_DIR, SIMFLEET_CACHE, SIMFLEET_PORTS, SIMFLEET_LAYOUT,
SIMFLEET_MIRROR (see tests/simfleet/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from simfleet import DEFAULT_LAYOUT, DEFAULT_PORT_RANGE
from simfleet.proc import SimfleetError


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", default=argparse.SUPPRESS, help="fleet name (default $SIMFLEET_NAME or 'default')")
    common.add_argument("--state-dir", default=argparse.SUPPRESS, help="fleet directory (default <cache>/fleets/<name>)")
    common.add_argument("--cache", default=argparse.SUPPRESS, help="cache directory (default $SIMFLEET_CACHE or <repo>/.cache/simfleet)")

    p = argparse.ArgumentParser(prog="simfleet", parents=[common], description="Simulated GPU fleet of booted Debian 12 nodes.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    up = sub.add_parser("up", parents=[common], help="bring nodes up (existing ones are kept)")
    up.add_argument("count", nargs="?", type=int, help="number of nodes (default: the fleet's, or 4)")
    up.add_argument("--layout", help="GPU classes, cycled (h100,a100) or counted (h100:2,v100:1); default $SIMFLEET_LAYOUT or %s" % DEFAULT_LAYOUT)
    up.add_argument("--ports", help="port range for SSH and the repository (default $SIMFLEET_PORTS or %s)" % DEFAULT_PORT_RANGE)
    up.add_argument("--mirror", help="Debian mirror for the base (default $SIMFLEET_MIRROR or the host's)")
    up.add_argument("--timeout", type=float, help="seconds to wait for the nodes' SSH")
    up.add_argument("--json", action="store_true", help="print the status as JSON")
    up.add_argument("--slurm", action="store_true",
                    help="add a Slurm cluster: slurmctld and munged on the host, slurmd and munged in every node (kept by the fleet)")

    down = sub.add_parser("down", parents=[common], help="stop everything the fleet started and unmount")
    down.add_argument("--purge", action="store_true", help="also remove the fleet directory")
    down.add_argument("--timeout", type=float, default=30.0, help="seconds for a clean poweroff before killing")

    st = sub.add_parser("status", parents=[common], help="state of the fleet")
    st.add_argument("--json", action="store_true")

    inv = sub.add_parser("inventory", parents=[common], help="print the Ansible inventory")
    inv.add_argument("--format", choices=("yaml", "ini", "json"), default="yaml")
    inv.add_argument("--path", action="store_true", help="print the inventory file's path instead")

    fault = sub.add_parser("fault", parents=[common], help="inject a fault on a node")
    fault.add_argument("node", help="node name, or 'all'")
    fault.add_argument("kind", help="reboot_hang, repo_unreachable, clear [kind=K], or a GPU fault kind "
                       "(build_fail, gpu_lost, xid_storm, nvml_not_supported, version_mismatch, gpu_busy)")
    fault.add_argument("args", nargs="*", help="arguments of the fault: KEY=VALUE or positional (e.g. build_fail 580.126.20; xid_storm 79 5 1)")

    reset = sub.add_parser("reset", parents=[common], help="put nodes back to fresh")
    reset.add_argument("nodes", nargs="*")

    reboot = sub.add_parser("reboot", parents=[common], help="reboot a node and wait for its new boot")
    reboot.add_argument("node")
    reboot.add_argument("--no-wait", action="store_true")
    reboot.add_argument("--timeout", type=float, default=120.0)

    ssh = sub.add_parser("ssh", parents=[common], help="ssh into a node as root")
    ssh.add_argument("node")
    ssh.add_argument("cmd", nargs=argparse.REMAINDER)

    b = sub.add_parser("base", parents=[common], help="build the cached base (debootstrap and node layer)")
    b.add_argument("--mirror")

    sub.add_parser("gc", parents=[common], help="remove cached bases and packages that no fleet uses")
    sub.add_parser("list", parents=[common], help="list the fleets in the cache")

    serve = sub.add_parser("_serve-repo", help=argparse.SUPPRESS)
    serve.add_argument("fleet_dir")
    serve.add_argument("port", type=int)
    return p


def _flag_text(flag: dict | None, width: int = 48) -> str:
    """The FLAG column: ``-`` when the node carries no rollout flag, else its stage and reason, cut to ``width``."""
    if not flag or not flag.get("flagged"):
        return "-"
    text = " ".join(str(part) for part in (flag.get("stage"), flag.get("reason")) if part) or "flagged"
    return text if len(text) <= width else text[:width - 3] + "..."


def _status_text(st: dict) -> str:
    """``simfleet status`` as text: the fleet, its repository, one line per node.

    Per node: name, GPU class, SSH port, state (``*`` when a reboot hang is armed), nspawn pid,
    installed driver version, drain mark (``drained`` or ``-``), rollout flag (stage and reason,
    see :func:`_flag_text`), on a fleet with Slurm the node's Slurm state as ``scontrol show node``
    gives it (``IDLE``, ``MIXED+DRAIN``, ...; ``-`` while slurmctld does not know it), and boot id.
    """
    with_slurm = bool(st.get("slurm"))
    row = "%-8s %-6s %-6s %-10s %-8s %-12s %-8s %-48s " + ("%-22s " if with_slurm else "%s") + "%s"
    lines = ["fleet %s  (%s)" % (st["name"], st["dir"]),
             "inventory %s" % st["inventory"],
             "apt repository: %s on 127.0.0.1:%s%s" % (st["repo"]["state"], st["repo"]["port"],
                                                       "  blocked: " + ",".join(st["repo"]["blocked"]) if st["repo"]["blocked"] else "")]
    if with_slurm:
        ctld = st["slurm"]["slurmctld"]
        lines.append("slurmctld: %s on 127.0.0.1:%s  SLURM_CONF=%s  (wrappers in %s)"
                     % (ctld["state"], ctld["port"], st["slurm"]["conf"], st["slurm"]["bin"]))
    lines.append(row % ("NODE", "CLASS", "PORT", "STATE", "NSPAWN", "DRIVER", "DRAIN", "FLAG", "SLURM" if with_slurm else "", "BOOT ID"))
    for n in st["nodes"]:
        state = n["state"] + ("*" if n["reboot_hang"] else "")
        slurm_state = ((n.get("slurm") or {}).get("state") or "-") if with_slurm else ""
        lines.append(row % (n["name"], n["class"], n["port"], state, n["nspawn_pid"] or "-", n.get("driver_version") or "-",
                            "drained" if n.get("drained") else "-", _flag_text(n.get("flag")), slurm_state, n["boot_id"] or "-"))
    return "\n".join(line.rstrip() for line in lines)


def ssh_command(node_argv: list[str], words: list[str]) -> list[str]:
    """The ``ssh`` command line of ``simfleet ssh NODE [COMMAND ...]``, as ``ssh`` itself treats COMMAND.

    :param node_argv: the ssh command line that reaches the node (``Node.ssh_argv`` with no command).
    :param words: the words after NODE. Like ssh, they are joined with spaces and the node's shell
        reads the result, so ``simfleet ssh node01 'cmd1; cmd2'`` runs both commands there and
        ``simfleet ssh node01 ls -l /tmp`` runs ``ls -l /tmp``. A leading ``--`` is dropped.
    :returns: the command line to exec; with no command, one that asks for a terminal (``-t``).
    """
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        return node_argv[:1] + ["-t"] + node_argv[1:]
    return node_argv + [" ".join(words)]


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 failed, 2 usage)."""
    args = _parser().parse_args(argv)
    if args.command == "_serve-repo":
        from simfleet import aptrepo  # pylint: disable=import-outside-toplevel

        aptrepo.serve(args.fleet_dir, args.port)
        return 0
    from simfleet import base  # pylint: disable=import-outside-toplevel
    from simfleet.fleet import Fleet, all_fleets, in_use_layers  # pylint: disable=import-outside-toplevel

    try:
        fleet = Fleet(getattr(args, "name", None), getattr(args, "state_dir", None), getattr(args, "cache", None))
        cmd = args.command
        if cmd == "up":
            st = fleet.up(args.count, args.layout, args.mirror, args.ports, args.timeout, slurm_cluster=args.slurm)
            print(json.dumps(st, indent=2) if args.json else _status_text(st))
        elif cmd == "down":
            fleet.down(purge=args.purge, timeout=args.timeout)
        elif cmd == "status":
            st = fleet.status()
            print(json.dumps(st, indent=2) if args.json else _status_text(st))
        elif cmd == "inventory":
            from simfleet import inventory  # pylint: disable=import-outside-toplevel

            if args.path:
                print(fleet.inventory_path if args.format == "yaml" else os.path.join(fleet.dir, "inventory." + args.format))
            else:
                data = fleet.inventory_data()
                render = {"yaml": inventory.render_yaml, "ini": inventory.render_ini, "json": inventory.render_json}[args.format]
                sys.stdout.write(render(data))
        elif cmd == "fault":
            print(json.dumps(fleet.fault(args.node, args.kind, args.args)))
        elif cmd == "reset":
            print(_status_text(fleet.reset(args.nodes or None)))
        elif cmd == "reboot":
            boot = fleet.reboot(args.node, wait=not args.no_wait, timeout=args.timeout)
            print(boot or "")
        elif cmd == "ssh":
            n = fleet.node(args.node)
            argv_ssh = ssh_command(n.ssh_argv(fleet.ssh_key), args.cmd)
            os.execvp(argv_ssh[0], argv_ssh)
        elif cmd == "base":
            base.check_host()
            print("\n".join(base.ensure_base(fleet.cache, args.mirror)))
        elif cmd == "gc":
            used = in_use_layers(fleet.cache)
            from simfleet import slurm  # pylint: disable=import-outside-toplevel

            current = {"debootstrap-" + base.debootstrap_key(), "layer-" + base.layer_key(),
                       "packages-" + base.gpu_files_digest()[:16],
                       "slurm-" + slurm.layer_key([os.path.join(fleet.cache, "layer-" + base.layer_key(), "rootfs"),
                                                   os.path.join(fleet.cache, "debootstrap-" + base.debootstrap_key(), "rootfs")])}
            for path in base.cached_dirs(fleet.cache):
                name = os.path.basename(path)
                if path in used or name in current:
                    continue
                base.remove_cached(path)
                print("removed " + path)
        elif cmd == "list":
            for name in all_fleets(fleet.cache):
                print(name)
    except SimfleetError as exc:
        print("simfleet: error: %s" % exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("simfleet: interrupted", file=sys.stderr)
        return 130
    return 0
