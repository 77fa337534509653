# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``simgpu-boot.service`` does at every boot of a node.

1. Apply the boot rules to the state (``simgpu.device.apply_boot_rules``): pending ECC/MIG
   become current, power limit / persistence / compute mode back to defaults, MIG instances
   cleared, armed ``gpu_lost`` faults take effect, a new kernel log for the new boot id.
2. "Load" the module built for the running kernel, if there is one and it can drive the
   GPUs present (open modules need Turing+, Blackwell needs open modules, R580 is the last
   branch for Volta): in a booted node, tmpfs is mounted over ``/proc/driver`` and
   ``/sys/module`` and the version files are written there; the kernel log gets the load
   banner, or the reason the probe failed. The ``version_mismatch`` fault makes the loaded
   version differ from the one on disk.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from typing import Any, Dict, List, Optional

from . import catalog, device, driver, faults, kernel_release, klog, root_dir, state_path
from .state import update_state


def _stale_version(version: str) -> str:
    """Another version of the same branch than ``version`` (what a stale initramfs loads)."""
    parts = version.split(".")
    if len(parts) >= 2 and parts[1].isdigit():
        minor = int(parts[1])
        parts[1] = str(minor - 1 if minor > 0 else minor + 1).zfill(len(parts[1]))
    return ".".join(parts)


def _read_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", "r", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return str(uuid.uuid4())


def _is_mountpoint(path: str) -> bool:
    try:
        with open("/proc/self/mountinfo", "r", encoding="utf-8") as handle:
            return any(line.split()[4] == path for line in handle if len(line.split()) > 4)
    except OSError:
        return False


def mount_tmpfs() -> List[str]:
    """Mount tmpfs over /proc/driver and /sys/module (in the node's own mount namespace)."""
    mounted = []
    for target in ("/proc/driver", "/sys/module"):
        if not os.path.isdir(target) or _is_mountpoint(target):
            continue
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=4m", "tmpfs", target], check=True)
        mounted.append(target)
    return mounted


def _probe_failure_lines(gpu: Dict[str, Any], problem: str, version: str) -> List[str]:
    bus = gpu["pci"]["bus_id"][4:].lower()
    pci_id = "10de:%04x" % ((int(gpu["pci"]["device_id"]) >> 16) & 0xFFFF)
    if problem == "open_unsupported":
        return ["NVRM: The NVIDIA GPU %s (PCI ID: %s)" % (bus, pci_id),
                "NVRM: installed in this system is not supported by open",
                "NVRM: nvidia.ko because it does not include the required GPU",
                "NVRM: System Processor (GSP)."]
    if problem == "needs_open":
        return ["NVRM: The NVIDIA GPU %s (PCI ID: %s)" % (bus, pci_id),
                "NVRM: installed in this system requires use of the NVIDIA open kernel modules."]
    if problem == "legacy":
        return ["NVRM: The NVIDIA %s GPU installed in this system is" % gpu["name"],
                "NVRM:  supported through the NVIDIA 580.xx Legacy drivers.",
                "NVRM: The %s NVIDIA driver will ignore" % version,
                "NVRM: this GPU.  Continuing probe..."]
    return ["NVRM: The NVIDIA GPU %s (PCI ID: %s)" % (bus, pci_id),
            "NVRM: installed in this system is not supported by the",
            "NVRM: NVIDIA %s driver release." % version]


def boot(root: Optional[str] = None, release: Optional[str] = None, boot_id: Optional[str] = None,
         now: Optional[float] = None, mount: bool = False) -> Dict[str, Any]:
    """Run the boot sequence for the node at ``root``; return what happened.

    Returns ``{"boot_id", "loaded": {"version", "flavor"} | None, "reason": None | "no_module" |
    "no_supported_gpu", "lost": [physical indexes that fell off the bus]}``. ``mount`` mounts
    the tmpfs first (only meaningful inside a booted node, root ``/``).
    """
    base = root_dir(root)
    release = kernel_release(release)
    boot_id = boot_id or _read_boot_id()
    now = time.time() if now is None else now
    if mount:
        mount_tmpfs()
    driver.clear_loaded(base)
    on_disk = driver.on_disk_module(base, release)

    def mutate(state: Dict[str, Any]) -> Dict[str, Any]:
        lost = device.apply_boot_rules(state, boot_id, now, release)
        result: Dict[str, Any] = {"boot_id": boot_id, "loaded": None, "reason": None, "lost": lost, "gpus": []}
        clock = [4.101217]

        def log(text: str) -> None:
            klog.append(state, text, at=clock[0])
            clock[0] += 0.013171

        if on_disk is None:
            result["reason"] = "no_module"
            return result
        version, flavor = on_disk["version"], on_disk["flavor"]
        mismatch = (state.get("faults") or {}).get("version_mismatch")
        if mismatch:
            version = mismatch.get("loaded_version") or _stale_version(version)
        log("nvidia: loading out-of-tree module taints kernel.")
        if flavor == "proprietary":
            log("nvidia: module license 'NVIDIA' taints kernel.")
            log("Disabling lock debugging due to kernel taint")
        log("nvidia: module verification failed: signature and/or required key missing - tainting kernel")
        log("nvidia-nvlink: Nvlink Core is being initialized, major device number 234")
        present = [g for g in state["gpus"] if device.bus_state(g) != "absent"]
        driven = []
        for gpu in present:
            problem = catalog.support_problem(gpu["architecture"], version, flavor)
            if problem:
                for line in _probe_failure_lines(gpu, problem, version):
                    log(line)
            else:
                driven.append(gpu)
        if not driven:
            if present:
                log("NVRM: The NVIDIA probe routine failed for %d device(s)." % len(present))
            log("NVRM: None of the NVIDIA devices were initialized.")
            log("nvidia-nvlink: Unregistered Nvlink Core, major device number 234")
            result["reason"] = "no_supported_gpu"
            return result
        faults.apply_driver_contract(state, driven, version)
        for gpu in driven:
            bus = gpu["pci"]["bus_id"][4:].lower()
            log("nvidia %s: enabling device (0000 -> 0002)" % bus)
        log(driver.load_banner(version, flavor))
        log("nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  %s" % version)
        log("nvidia-uvm: Loaded the UVM driver, major device number 510.")
        for index in lost:
            gpu = state["gpus"][index]
            for line in klog.xid_lines(gpu, 79, catalog.XID_TEXT[79][0]):
                log(line)
        result["loaded"] = {"version": version, "flavor": flavor}
        result["gpus"] = [dict(g) for g in driven]
        return result

    result = update_state(state_path(base), mutate)
    if result["loaded"]:
        driver.write_loaded(base, result["loaded"]["version"], result["loaded"]["flavor"], result["gpus"])
    result.pop("gpus", None)
    return result
