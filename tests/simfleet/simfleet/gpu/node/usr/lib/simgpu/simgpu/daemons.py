# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stand-ins for nvidia-persistenced and nv-fabricmanager (started by their systemd units).

- ``nvidia-persistenced`` turns persistence mode on for every GPU while it runs (and off when
  stopped), as the real daemon keeps the GPUs initialised. It needs a loaded driver.
- ``nv-fabricmanager`` refuses to run unless its version equals the loaded driver's exactly
  (the real "driver interface version ... don't match with driver version ..." failure) and
  unless the node has NVSwitches; when it runs, nvidia-smi shows the fabric as Completed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Optional, Sequence, TextIO

from . import device as D, driver, root_dir, state_path
from .state import update_state

FM_MARKER_RELPATH = "run/nvidia-fabricmanager/simgpu.json"


def persistenced_main(argv: Sequence[str], root: Optional[str] = None, stdout: TextIO = sys.stdout) -> int:
    """``nvidia-persistenced [--stop]``: persistence mode on (off with --stop) on all GPUs."""
    base = root_dir(root)
    mode = 0 if "--stop" in argv else 1
    if mode and driver.loaded_module(base) is None:
        stdout.write("nvidia-persistenced failed to initialize. Check syslog for more details.\n")
        return 1

    def mutate(state: Dict[str, Any]) -> None:
        for gpu in state["gpus"]:
            if D.bus_state(gpu) == "ok" and D.supported(gpu, "persistence_mode"):
                gpu["persistence_mode"] = mode

    update_state(state_path(base), mutate)
    return 0


def fabricmanager_running(root: Optional[str], driver_version: str) -> bool:
    """True when nv-fabricmanager started successfully for ``driver_version`` in this boot."""
    try:
        with open(os.path.join(root_dir(root), FM_MARKER_RELPATH), "r", encoding="utf-8") as handle:
            return json.load(handle).get("version") == driver_version
    except (OSError, ValueError):
        return False


def fabricmanager_main(argv: Sequence[str], root: Optional[str] = None, stdout: TextIO = sys.stdout) -> int:
    """``nv-fabricmanager --version V [--stop]``: start (or stop) the fabric manager stand-in."""
    base = root_dir(root)
    marker = os.path.join(base, FM_MARKER_RELPATH)
    if "--stop" in argv:
        if os.path.exists(marker):
            os.unlink(marker)
        return 0
    args = list(argv)
    version = args[args.index("--version") + 1] if "--version" in args else ""
    loaded = driver.loaded_module(base)
    if loaded is None:
        stdout.write("fabric manager failed to open the NVIDIA GPU driver: Driver Not Loaded\n")
        return 1
    if loaded["version"] != version:
        stdout.write("fabric manager NVIDIA GPU driver interface version %s don't match with driver version %s. "
                     "Please update with matching NVIDIA driver package.\n" % (version, loaded["version"]))
        return 1
    try:
        with open(state_path(base), "r", encoding="utf-8") as handle:
            switches = int((json.load(handle).get("system") or {}).get("nvswitch_count") or 0)
    except (OSError, ValueError):
        switches = 0
    if not switches:
        stdout.write("request to query NVSwitch device information from NVSwitch driver failed with "
                     "error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]\n")
        return 1
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(marker, "w", encoding="utf-8") as handle:
        json.dump({"version": version, "pid": os.getpid()}, handle)
    stdout.write("Successfully configured all the available NVSwitches to route GPU NVLink traffic. NVLink "
                 "Peer-to-Peer support will be enabled once the GPUs are successfully registered with the NVLink "
                 "fabric.\n")
    return 0
