# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``simgpu <command>``: the entry point every node-side front end executes.

Commands: ``boot [--mount]`` (simgpu-boot.service), ``nvidia-smi ...``, ``dmesg ...``,
``persistenced [--stop]``, ``fabricmanager --version V [--stop]``, ``status`` (driver files as
JSON), ``fault KIND [ARGS...]`` (apply a state fault from inside the node), ``slurm-gres --write PATH``
(the node's gres.conf as Slurm's AutoDetect would find the GPUs and MIG devices: slurmd's
ExecStartPre on a fleet with Slurm).
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional, Sequence, TextIO

from . import boot, daemons, driver, faults, is_root, klog, root_dir, slurm_gres, smi, state_path
from .state import load_state, update_state

_DMESG_FLAGS_WITH_VALUE = ("-l", "--level", "-f", "--facility", "--time-format", "-s", "--buffer-size", "--color")
_DMESG_FLAGS = ("-T", "--ctime", "-t", "--notime", "-k", "--kernel", "-x", "--decode", "-H", "--human", "-P",
                "--nopager", "-L", "-w", "--follow", "-c", "--read-clear", "-C", "--clear", "-e", "--reltime")


def dmesg_main(argv: Sequence[str], root: Optional[str] = None, stdout: TextIO = sys.stdout,
               stderr: TextIO = sys.stderr) -> int:
    """The ``dmesg`` stand-in: print the simulated kernel log of the current boot."""
    args = list(argv)
    human = no_time = clear = read_clear = False
    while args:
        item = args.pop(0)
        key = item.split("=", 1)[0]
        if key in _DMESG_FLAGS_WITH_VALUE:
            if "=" not in item and key not in ("--color",):
                if not args:
                    stderr.write("dmesg: option requires an argument -- '%s'\n" % key.lstrip("-"))
                    return 1
                args.pop(0)
        elif key in ("-T", "--ctime", "-e", "--reltime"):
            human = True
        elif key in ("-t", "--notime"):
            no_time = True
        elif key in ("-C", "--clear"):
            clear = True
        elif key in ("-c", "--read-clear"):
            read_clear = True
        elif key in _DMESG_FLAGS:
            continue
        else:
            stderr.write("dmesg: unrecognized option '%s'\nTry 'dmesg --help' for more information.\n" % item)
            return 1
    path = state_path(root)
    try:
        state = load_state(path)
    except (OSError, ValueError):
        state = {}
    if (clear or read_clear) and not is_root():
        stderr.write("dmesg: klogctl failed: Operation not permitted\n")
        return 1
    if not clear:
        stdout.write(klog.render(state.get("kernel_log"), human_time=human, no_time=no_time))
    if (clear or read_clear) and state.get("kernel_log"):
        def mutate(current: dict) -> None:
            if current.get("kernel_log"):
                current["kernel_log"]["lines"] = []

        update_state(path, mutate)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Dispatch ``simgpu <command> [args]``; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.stderr.write("usage: simgpu {boot,nvidia-smi,dmesg,persistenced,fabricmanager,status,fault,slurm-gres} ...\n")
        return 2
    command, rest = argv[0], argv[1:]
    if command == "boot":
        result = boot.boot(mount="--mount" in rest)
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        return 0
    if command == "nvidia-smi":
        return smi.main(rest)
    if command == "dmesg":
        return dmesg_main(rest)
    if command == "persistenced":
        return daemons.persistenced_main(rest)
    if command == "fabricmanager":
        return daemons.fabricmanager_main(rest)
    if command == "status":
        sys.stdout.write(json.dumps(driver.status(root_dir(None)), indent=1, sort_keys=True) + "\n")
        return 0
    if command == "slurm-gres":
        if len(rest) != 2 or rest[0] != "--write":
            sys.stderr.write("usage: simgpu slurm-gres --write PATH\n")
            return 2
        count = slurm_gres.write(load_state(state_path(None)), rest[1])
        sys.stdout.write("%s: %d gres/gpu\n" % (rest[1], count))
        return 0
    if command == "fault":
        if not rest:
            sys.stderr.write("usage: simgpu fault KIND [ARGS...]\n")
            return 2
        try:
            update_state(state_path(None), lambda state: faults.apply_fault(state, rest[0], rest[1:]) and None)
        except ValueError as err:
            sys.stderr.write("simgpu fault: %s\n" % err)
            return 2
        return 0
    sys.stderr.write("simgpu: unknown command %r\n" % command)
    return 2
